"""FSDP2 (fully_shard) over te modules whose weights are FP8 (te.quantized_model_init): the shards
stay FP8, the all-gather moves FP8 bytes, and training with fp32 master weights matches one process
bit for bit. Each case runs its ranks as processes over gloo on the CPU (the GPU's NCCL path is the
same Python with another backend)."""

import pytest
import torch
from _fsdp2_rank import SHARD, WIRE, run


@pytest.mark.parametrize(
    "world, recipe",
    # 3: uneven shards (32 / 48 / 96 rows); block: 128x128 tiles, two shards of whole tiles each;
    # block1d / mxfp8 / nvfp4: two shards of whole 128- / 32- / 16-row blocks each; 1: FSDP2's
    # one-rank path, which gathers nothing (a single GPU)
    [
        (2, "current"),
        (2, "delayed"),
        (3, "current"),
        (2, "block"),
        (2, "block1d"),
        (2, "mxfp8"),
        (2, "nvfp4"),
        (1, "block"),
        (1, "nvfp4"),
    ],
)
def test_fsdp2_fp8_shards_train_as_one_process(tmp_path, world, recipe):
    ranks = run(tmp_path, world, recipe, "train")
    for r in ranks:
        # every FP8 weight: a shard of 1-byte elements (NVFP4: element pairs) in the weight's
        # format, row-wise only (1x128 blocks, MXFP8, NVFP4: both copies, the column-wise one
        # being no transpose), with the reference's rows and their scale (the weight's one, or
        # its rows' block scales, and NVFP4's global amaxes)
        assert len(r["shards"]) == 4
        rowwise_only = recipe in ("current", "delayed", "block")
        for shard in r["shards"]:
            assert shard == [SHARD[recipe], 1, rowwise_only, True, True]
        for s in r["steps"]:
            # quantize_ on a shard took the whole weight's amax (per-tensor scales, NVFP4's global
            # amaxes) or quantized its own blocks as the whole weight does (block scales)
            assert s["scales_equal"]
            if world <= 2:  # (g + g) / 2 is exact: the gathered weights and outputs are the reference's
                assert s["y_equal"], s
                assert s["g_err"] == 0.0, s
            else:  # (g + g + g) / 3 rounds: an ulp apart, which the next steps carry
                assert s["y_err"] < 1e-6 and s["g_err"] < 1e-6, s
        assert r["steps"][0]["y_equal"]
        assert (
            r["wire"] == [WIRE[recipe] if world > 1 else ["torch.uint8"]] * 4
        )  # FP8 bytes, not a high-precision copy


@pytest.mark.parametrize("recipe, what", [("current", "scales (scale_inv)"), ("nvfp4", "global amaxes")])
def test_fsdp2_shards_with_different_scales_fail_on_every_rank(tmp_path, recipe, what):
    ranks = run(tmp_path, 2, recipe, "mixed_scales")
    for r in ranks:
        assert r["error"] is not None and f"shards hold different {what}" in r["error"]
        assert "same seed" in r["error"]


def test_float8_row_ops_keep_the_format():
    # the ops fully_shard shards with, on one process: split, new_zeros, narrow, view, as_strided
    import te_torch as te

    with te.quantized_model_init(recipe=te.recipe.Float8CurrentScaling()):
        m = te.Linear(64, 48)
    w = m.weight
    pieces = torch.chunk(w, 3, dim=0)
    assert all(type(p) is type(w) and p._transpose is None for p in pieces)
    assert torch.equal(torch.cat([p.dequantize() for p in pieces]), w.dequantize())
    # a piece of a tensor with a column-wise copy is a copy (its rows alone cannot be a view of
    # both copies): writes stay in it
    pieces[0].quantize_(torch.zeros(16, 64))
    assert w.dequantize()[:16].abs().max() > 0
    padded = w.new_zeros((20, 64))
    assert type(padded) is type(w) and padded._data.dtype == w._data.dtype
    padded.narrow(0, 0, 16).copy_(pieces[1])
    assert torch.equal(padded.dequantize()[:16], w.dequantize()[16:32])
    assert torch.equal(padded.dequantize()[16:], torch.zeros(4, 64))
    flat = padded.view(-1)
    assert type(flat) is type(w) and flat.shape == (20 * 64,)
    rows = torch.as_strided(padded, (10, 64), (64, 1))
    assert torch.equal(rows.dequantize(), padded.dequantize()[:10])
    # a view of rows shares the bytes: writing it writes the parent
    padded.narrow(0, 16, 4).copy_(pieces[2][:4])
    assert torch.equal(padded.dequantize()[16:], w.dequantize()[32:36])
    # with the column-wise copy present, a slice cannot be a view of both: high precision
    assert type(w[1:3]) is torch.Tensor
    assert torch.equal(w[1:3], w.dequantize()[1:3])


def test_block_row_ops_keep_the_format_at_tile_boundaries():
    # fully_shard's ops on a 128x128-tile weight, on one process: pieces of whole tiles stay FP8
    import te_torch as te

    with te.quantized_model_init(recipe=te.recipe.Float8BlockScaling()):
        m = te.Linear(200, 512)  # K = 200: two tile columns, the second partial
    w = m.weight
    pieces = torch.chunk(w, 2, dim=0)
    assert all(type(p) is type(w) and p._columnwise_data is None for p in pieces)
    assert [tuple(p._rowwise_scale_inv.shape) for p in pieces] == [(2, 4), (2, 4)]
    assert torch.equal(torch.cat([p.dequantize() for p in pieces]), w.dequantize())
    assert type(torch.chunk(w, 4, dim=0)[3]) is type(w)  # 128 rows each: one tile row
    # a piece of a tensor with a column-wise copy is a copy: writes stay in it
    pieces[0].quantize_(torch.zeros(256, 200))
    assert w.dequantize()[:256].abs().max() > 0
    padded = w.new_zeros((256, 200))
    assert type(padded) is type(w) and padded._rowwise_data.dtype == w._rowwise_data.dtype
    # zeros of a shape split would not keep (half a tile; 512 rows not in pieces of 384): plain,
    # as FSDP2's padded shard of a weight whose pieces went high precision must be
    assert type(w.new_zeros((64, 200))) is torch.Tensor and type(w.new_zeros((384, 200))) is torch.Tensor
    padded.narrow(0, 0, 256).copy_(pieces[1])
    assert torch.equal(padded.dequantize(), w.dequantize()[256:])
    # FSDP2's flat view of a shard: the same parts, values in the flat order
    flat = padded.view(-1)
    assert type(flat) is type(w) and flat.shape == (256 * 200,)
    assert flat._rowwise_data.data_ptr() == padded._rowwise_data.data_ptr()
    assert torch.equal(flat.dequantize(), padded.dequantize().view(-1))
    # quantizing through the flat view or a shard gives the whole weight's tiles: tiles are local
    x = torch.randn(512, 200)
    whole = te.Float8BlockQuantizer(torch.float8_e4m3fn)(x).dequantize()
    flat.quantize_(x[256:].reshape(-1))
    pieces[0].quantize_(x[:256])
    assert torch.equal(padded.dequantize(), whole[256:]) and torch.equal(pieces[0].dequantize(), whole[:256])
    # a slice of tile rows is a view: writing it writes the parent
    rows = padded[128:]
    assert type(rows) is type(w) and torch.equal(rows.dequantize(), whole[384:])
    rows.quantize_(torch.zeros(128, 200))
    assert torch.equal(padded.dequantize()[128:], torch.zeros(128, 200))
    # the unsharded weight FSDP2 makes with as_strided: the tensor itself
    same = torch.as_strided(w, (512, 200), (200, 1))
    assert type(same) is type(w) and same._columnwise_data is w._columnwise_data
    # a view keeping the last dim keeps both copies
    v = w.view(2, 256, 200)
    assert type(v) is type(w) and torch.equal(v.dequantize(), w.dequantize().view(2, 256, 200))
    # a row inside a tile or a cut through one: high precision
    assert type(padded[1:3]) is torch.Tensor and torch.equal(padded[1:3], padded.dequantize()[1:3])
    assert all(type(p) is torch.Tensor for p in torch.chunk(w, 3, dim=0))


def _columnwise(t):
    """A block-scaled tensor as its column-wise copy alone sees it (dequantized)."""
    return t._like(None, None, t._columnwise_data, t._columnwise_scale_inv).dequantize()


def _assert_pieces_are_its_rows(w, pieces) -> None:
    """Row pieces of ``w`` that kept its format: both copies are ``w``'s, row range by row range."""
    assert all(type(p) is type(w) for p in pieces)
    assert torch.equal(torch.cat([p.dequantize() for p in pieces]), w.dequantize())
    assert torch.equal(torch.cat([_columnwise(p) for p in pieces]), _columnwise(w))


def _assert_only_whole_blocks_keep_it(w, rows: slice, cut_chunks: int) -> None:
    """FSDP2's unsharded weight (as_strided over the whole) is ``w`` itself; a row range off the
    whole tensor (``rows``) and ``cut_chunks`` chunks cutting a block are high precision."""
    same = torch.as_strided(w, tuple(w.shape), (w.shape[1], 1))
    assert type(same) is type(w) and same._columnwise_data is w._columnwise_data
    assert type(w[rows]) is torch.Tensor and torch.equal(w[rows], w.dequantize()[rows])
    assert all(type(p) is torch.Tensor for p in torch.chunk(w, cut_chunks, dim=0))


def test_block_1x128_row_ops_keep_both_copies_at_block_boundaries():
    # fully_shard's ops on a 1x128-block weight: pieces of whole 128-row blocks keep both copies
    # (the column-wise one has its own 128x1 blocks), each part a copy of the piece's own
    import te_torch as te

    with te.quantized_model_init(recipe=te.recipe.Float8BlockScaling(w_block_scaling_dim=1)):
        m = te.Linear(200, 384)  # K = 200: two blocks a row, the second partial
    w = m.weight

    pieces = torch.chunk(w, 3, dim=0)
    _assert_pieces_are_its_rows(w, pieces)
    assert [tuple(p._rowwise_scale_inv.shape) for p in pieces] == [(2, 128)] * 3  # transposed scales
    assert [tuple(p._columnwise_data.shape) for p in pieces] == [(200, 128)] * 3
    padded = w.new_zeros((128, 200))
    assert type(padded) is type(w) and torch.equal(padded.dequantize(), torch.zeros(128, 200))
    assert type(w.new_zeros((64, 200))) is torch.Tensor  # a piece split would cut a block in
    padded.narrow(0, 0, 128).copy_(pieces[1])
    assert torch.equal(padded.dequantize(), w.dequantize()[128:256])
    assert torch.equal(_columnwise(padded), _columnwise(w)[128:256])
    flat = padded.view(-1)
    assert type(flat) is type(w) and torch.equal(flat.dequantize(), padded.dequantize().view(-1))
    # quantizing through the flat view gives the whole weight's blocks: blocks are local
    x = torch.randn(384, 200)
    whole = te.Float8BlockQuantizer(torch.float8_e4m3fn, block_scaling_dim=1)(x)
    flat.quantize_(x[128:256].reshape(-1))
    assert torch.equal(padded.dequantize(), whole.dequantize()[128:256])
    assert torch.equal(_columnwise(padded), _columnwise(whole)[128:256])
    _assert_only_whole_blocks_keep_it(w, slice(0, 128), 2)


def test_mxfp8_row_ops_keep_the_format_at_block_boundaries():
    # fully_shard's ops on an MXFP8 weight: pieces of whole 32-row blocks are MXFP8 tensors of
    # their own, both copies (the column-wise copy's columns, its scale table re-padded)
    import te_torch as te

    with te.quantized_model_init(recipe=te.recipe.MXFP8BlockScaling()):
        m = te.Linear(200, 192)  # K = 200: 7 blocks of 32 a row, the last partial
    w = m.weight

    pieces = torch.chunk(w, 3, dim=0)  # 64 rows each: neither scale table's padding multiple
    _assert_pieces_are_its_rows(w, pieces)
    assert [tuple(p._columnwise_data.shape) for p in pieces] == [(200, 64)] * 3
    padded = w.new_zeros((64, 200))
    assert type(w.new_zeros((48, 200))) is torch.Tensor  # a piece split would cut a block in
    padded.narrow(0, 0, 64).copy_(pieces[1])
    assert torch.equal(padded.dequantize(), w.dequantize()[64:128])
    flat = padded.view(-1)
    assert type(flat) is type(w) and flat.shape == (64 * 200,)
    assert torch.equal(flat.dequantize(), padded.dequantize().view(-1))
    # quantizing through the flat view gives the whole weight's blocks: blocks are local
    x = torch.randn(192, 200)
    whole = te.MXFP8Quantizer(torch.float8_e4m3fn)(x)
    flat.quantize_(x[64:128].reshape(-1))
    assert torch.equal(padded.dequantize(), whole.dequantize()[64:128])
    assert torch.equal(_columnwise(padded), _columnwise(whole)[64:128])
    _assert_only_whole_blocks_keep_it(w, slice(32, 64), 4)


@pytest.mark.parametrize("tiles", [True, False])  # 16x16 tiles (weights' default) / 1x16 blocks
def test_nvfp4_row_ops_keep_the_format_and_the_global_amaxes(tiles):
    # fully_shard's ops on an NVFP4 weight: pieces of whole 16-row blocks are NVFP4 tensors of
    # their own (E2M1 pairs, both copies, scale tables re-padded) that keep the whole weight's
    # global amaxes, which every block scale is relative to
    import te_torch as te

    recipe = te.recipe.NVFP4BlockScaling(disable_2d_quantization=not tiles)
    with te.quantized_model_init(recipe=recipe):
        m = te.Linear(200, 96)  # K = 200: 13 blocks of 16 a row, the last partial
    w = m.weight
    assert w._with_2d_quantization is tiles

    pieces = torch.chunk(w, 3, dim=0)  # 32 rows each
    _assert_pieces_are_its_rows(w, pieces)
    assert [tuple(p._columnwise_data.shape) for p in pieces] == [(200, 16)] * 3  # 32 rows, packed
    assert all(torch.equal(p._amax, w._amax) and p._amax is not w._amax for p in pieces)
    padded = w.new_zeros((32, 200))
    assert type(padded) is type(w) and torch.equal(padded.dequantize(), torch.zeros(32, 200))
    assert type(w.new_zeros((24, 200))) is torch.Tensor  # a piece split would cut a block in
    padded.narrow(0, 0, 32).copy_(pieces[1])
    assert torch.equal(padded.dequantize(), w.dequantize()[32:64]) and torch.equal(padded._amax, w._amax)
    flat = padded.view(-1)
    assert type(flat) is type(w) and flat.shape == (32 * 200,)
    assert torch.equal(flat.dequantize(), padded.dequantize().view(-1))
    assert torch.equal(flat.view(32, 200).dequantize(), padded.dequantize())
    # alone, a piece encodes with its own amaxes; given the whole weight's, its bytes are the
    # whole weight's rows
    x = torch.randn(96, 200)
    x[0, 0] = 50.0  # the largest element, outside the piece's rows
    whole = te.NVFP4Quantizer(with_2d_quantization=tiles)(x)
    flat.quantize_(x[32:64].reshape(-1))
    assert padded._amax.tolist() == [x[32:64].abs().max().item()] * 2
    assert not torch.equal(padded.dequantize(), whole.dequantize()[32:64])
    w._quantizer.update_quantized(x[32:64], padded, whole._amax.clone())
    assert torch.equal(padded._amax, whole._amax)
    assert torch.equal(padded.dequantize(), whole.dequantize()[32:64])
    assert torch.equal(_columnwise(padded), _columnwise(whole)[32:64])
    _assert_only_whole_blocks_keep_it(w, slice(16, 32), 4)  # 4 chunks: 24 rows, a cut block


def test_update_quantized_amax_says_what_it_expects():
    import te_torch as te

    x = torch.randn(32, 64)
    nv, mx = te.NVFP4Quantizer(), te.MXFP8Quantizer(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"amax: expected the fp32 \[2\] global amaxes .* on cpu, got"):
        nv.update_quantized(x, nv(x), torch.ones(1))
    with pytest.raises(ValueError, match="MXFP8 has no global amax; pass None"):
        mx.update_quantized(x, mx(x), torch.ones(2))


@pytest.mark.parametrize(
    "kwargs",
    [{"with_2d_quantization": True}, {}, {"with_rht": True}, {"with_rht": True, "columnwise": False}],
)
def test_an_nvfp4_shards_amaxes_are_the_quantizers_own(kwargs):
    # what an NVFP4 shard contributes to the all-reduce of its weight's global amaxes is what
    # its quantizer takes for the shard alone (after the Hadamard transform for that copy)
    import te_torch as te
    from te_torch import _fsdp

    q = te.NVFP4Quantizer(**kwargs)
    x = torch.randn(48, 64)
    x[5, 7] = -9.0
    want = q(x)._amax
    if q.columnwise_usage is False:
        want = want[:1].expand(2)  # the copy te does not write; the shard reduces both entries
    assert torch.equal(_fsdp.local_amaxes(q, x), want)


@pytest.mark.parametrize(
    "recipe, kwargs, rows, shards",
    [
        ("Float8BlockScaling", {}, 576, 3),  # 192 rows a shard: a cut through a tile
        ("Float8BlockScaling", {"w_block_scaling_dim": 1}, 384, 2),  # 1x128 blocks, 192 rows a shard
        ("MXFP8BlockScaling", {}, 96, 2),  # 48 rows a shard: a cut through a 32-row block
        ("NVFP4BlockScaling", {}, 48, 2),  # 24 rows a shard: a cut through a 16-row block
    ],
)
def test_a_weight_split_to_high_precision_says_when_shards_stay_fp8(caplog, recipe, kwargs, rows, shards):
    import logging

    import te_torch as te
    from te_torch import _info_once

    with te.quantized_model_init(recipe=getattr(te.recipe, recipe)(**kwargs)):
        m = te.Linear(128, rows)
    name = type(m.weight).__name__
    _info_once.told.discard(f"split:{name}")
    with caplog.at_level(logging.INFO, logger="te"):
        pieces = torch.chunk(m.weight, shards, dim=0)
        torch.chunk(m.weight, shards, dim=0)
    assert all(type(p) is torch.Tensor for p in pieces)
    assert torch.equal(torch.cat(pieces), m.weight.dequantize())
    said = [r.getMessage() for r in caplog.records if "was split" in r.getMessage()]
    assert len(said) == 1 and f"{name} parameter" in said[0], said
    rule = {
        "Float8BlockwiseQTensor": "Float8BlockwiseQTensor pieces stay FP8 when split along dim 0 into "
        "equal pieces of a multiple of 128 rows",
        "MXFP8Tensor": "MXFP8Tensor pieces stay MXFP8 when split along dim 0 into equal pieces of a "
        "multiple of 32 rows",
        "NVFP4Tensor": "NVFP4Tensor pieces stay NVFP4 when split along dim 0 into equal pieces of a "
        "multiple of 16 rows",
    }[name]
    assert rule in said[0], said


@pytest.mark.parametrize("recipe", ["current", "delayed", "block", "block1d", "mxfp8", "nvfp4"])
def test_fsdp2_fp8_shards_round_trip_through_dcp(tmp_path, recipe):
    # torch.distributed.checkpoint saves the sharded FP8 weights (and DelayedScaling's state) and
    # loads them into a model built fresh from other weights, which then computes the saved
    # model's outputs bit for bit
    states = 16 if recipe == "delayed" else 0  # amax history and scale, fwd and bwd, of 4 GEMMs
    for r in run(tmp_path, 2, recipe, "dcp"):
        assert r == {"equal": True, "shard": SHARD[recipe], "states": states, "states_equal": True}


@pytest.mark.parametrize("recipe", ["current", "block", "block1d", "mxfp8", "nvfp4"])
def test_fsdp2_fp8_shards_under_bf16_mixed_precision_compute_as_one_process_in_bf16(tmp_path, recipe):
    # MixedPrecisionPolicy(param_dtype=bf16): the FP8 bytes are gathered as they are and the
    # unsharded weight's nominal dtype is bf16, so outputs are one process's fed bf16, bit for bit
    for r in run(tmp_path, 2, recipe, "mixed_precision"):
        assert r == {"dtype": "torch.bfloat16", "equal": True, "grads": True}


def test_fsdp2_block_weights_split_off_tiles_train_in_high_precision_as_one_process(tmp_path):
    # 128-row weights over two ranks: shards of half a tile, so FSDP2 shards them in high
    # precision (INFO); each step quantizes them into the same tiles, and the outputs are one
    # process's with FP8 weights and fp32 masters, bit for bit
    for r in run(tmp_path, 2, "block", "split_high"):
        assert r["quantized"] == 0 and r["shards"] == ["Tensor"], r
        assert r["equal"] == [True] * 3, r


def test_fsdp2_high_precision_weights_reduce_the_amax_as_one_process(tmp_path):
    # weights FSDP2 shards in high precision, DelayedScaling with amax_reduction_group: each rank
    # fed half the batch keeps one process's scaling state bit for bit and trains as it does, up
    # to the order of the gradient sums
    for r in run(tmp_path, 2, "delayed", "high_precision"):
        assert len(r["states"]) == 16 and all(r["states"]), r
        assert r["y_err"] < 1e-6 and r["p_err"] < 1e-7, r


def test_an_fsdp2_shard_without_rowwise_bytes_says_how_to_restore_them():
    import te_torch as te

    with te.quantized_model_init(recipe=te.recipe.Float8CurrentScaling()):
        m = te.Linear(64, 32)
    w = m.weight
    w.update_usage(rowwise_usage=False)
    with pytest.raises(
        RuntimeError, match=r"no row-wise copy; restore it with update_usage\(rowwise_usage=True\)"
    ):
        w.fsdp_pre_all_gather(None, w.shape, None, m, None)
