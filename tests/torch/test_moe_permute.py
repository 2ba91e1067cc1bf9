"""te.moe_permute / moe_permute_with_probs / moe_unpermute / moe_sort_chunks_by_index(_with_probs)
on CPU, against a plain reference written here with explicit Python loops over tokens, experts and
slots in fp64 (TE's order: rows by expert, then token, then slot; num_out_tokens keeps the first
rows of that order and appends zero rows past the routed count; a routed slot of probability 0
gets a zero row). Gradients: torch.autograd.grad with random cotangents through both, and
gradcheck in fp64. Also the round trip with probabilities summing to 1 per token, empty inputs,
te's quantized tensors (bytes and row-wise scales moved exactly), and the errors."""

from __future__ import annotations

import random
import warnings

import pytest
import te_torch as te
import torch

T, E, H = 23, 6, 8
EMPTY_EXPERT = 2  # no token is routed to it
TOL = {
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.float16: dict(rtol=2e-3, atol=2e-3),
    torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2),
}
DTYPES = list(TOL)
DTYPE_IDS = ["fp32", "fp16", "bf16"]


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)


# -- the reference --------------------------------------------------------------------------------


def routing(map_type: str, topk: int, seed: int, num_tokens: int = T):
    """A random routing table: each token to ``topk`` distinct experts (never EMPTY_EXPERT); with
    a mask map tokens 0 and 5 go nowhere. Returns the table and its rows as Python lists."""
    rng = random.Random(seed)
    allowed = [e for e in range(E) if e != EMPTY_EXPERT]
    rows = [rng.sample(allowed, topk) for _ in range(num_tokens)]
    if map_type == "index":
        return torch.tensor(rows, dtype=torch.int32).view(num_tokens, topk), rows
    mask = [[e in r and t not in (0, 5) for e in range(E)] for t, r in enumerate(rows)]
    return torch.tensor(mask, dtype=torch.bool).view(num_tokens, E), mask


def ref_order(map_type: str, table: list) -> list:
    """(token, slot) of each permuted row, in TE's order, all routed slots."""
    order = []
    for e in range(E):
        for t in range(len(table)):
            if map_type == "mask":
                if table[t][e]:
                    order.append((t, e))
            else:
                for k in range(len(table[t])):
                    if table[t][k] == e:
                        order.append((t, k))
    return order


def ref_permute(x, order, n, probs=None):
    """The permuted rows (and probs) of x64 [T, H] (differentiable, fp64)."""
    zero = x.new_zeros(x.shape[1])
    rows, pp = [], []
    for r in range(n):
        if r >= len(order):
            rows.append(zero)
            pp.append(x.new_zeros(()))
            continue
        t, s = order[r]
        p = None if probs is None else probs[t, s]
        rows.append(zero if p is not None and float(p.detach()) == 0.0 else x[t])
        pp.append(x.new_zeros(()) if p is None else p)
    out = torch.stack(rows) if rows else x.new_zeros(0, x.shape[1])
    return out, (torch.stack(pp) if pp else x.new_zeros(0))


def ref_unpermute(y, order, num_tokens, merging=None):
    """out[t] = sum of merging[t, s] * y[r] over the kept rows r = (t, s) of token t (fp64)."""
    out = [y.new_zeros(y.shape[1]) for _ in range(num_tokens)]
    for r in range(min(y.shape[0], len(order))):
        t, s = order[r]
        w = 1.0 if merging is None else merging[t, s]
        out[t] = out[t] + w * y[r]
    return torch.stack(out) if out else y.new_zeros(0, y.shape[1])


def ref_sort_chunks(x, sizes: list, order: list):
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    rows = [starts[j] + i for j in order for i in range(sizes[j])]
    return rows, (torch.stack([x[i] for i in rows]) if rows else x[:0])


def num_out_for(mode: str, routed: int):
    return {"all": -1, "exact": routed, "drop": max(routed - 7, 0), "pad": routed + 3}[mode]


def router_probs(table, map_type, dtype, seed, zero_slot=False):
    """Probabilities over each token's routed slots summing to 1 (0 elsewhere); with
    ``zero_slot`` one routed slot gets probability exactly 0 (capacity padding)."""
    g = torch.Generator().manual_seed(seed)
    if map_type == "mask":
        routed = torch.tensor(table, dtype=torch.bool)
    else:
        routed = torch.ones(len(table), len(table[0]), dtype=torch.bool)
    p = (torch.rand(routed.shape, generator=g, dtype=torch.float64) + 0.1) * routed
    p = p / p.sum(1, keepdim=True).clamp(min=1e-30)
    if zero_slot:
        t, s = next(
            (t, s) for t in range(len(table)) for s in range(routed.shape[1]) if routed[t, s] and t > 5
        )
        p[t, s] = 0
    return p.to(dtype)


def grads(outs, inputs, cots):
    pairs = [(o, c) for o, c in zip(outs, cots, strict=True) if o is not None]
    return torch.autograd.grad([o for o, _ in pairs], inputs, [c for _, c in pairs], allow_unused=True)


def close(got, want, dtype, what):
    torch.testing.assert_close(got.double(), want.double(), **TOL[dtype], msg=lambda m: f"{what}: {m}")


# -- permute and unpermute against the reference --------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("mode", ["all", "exact", "drop", "pad"])
@pytest.mark.parametrize("topk", [1, 2, 3, 4])
@pytest.mark.parametrize("map_type", ["mask", "index"])
def test_permute_and_unpermute_match_the_reference(map_type, topk, mode, dtype):
    seed = (
        100 * topk
        + 10 * ["all", "exact", "drop", "pad"].index(mode)
        + DTYPES.index(dtype)
        + 7 * len(map_type)
    )
    table, rows = routing(map_type, topk, seed)
    order = ref_order(map_type, rows)
    assert not any(s == EMPTY_EXPERT for _, s in order if map_type == "mask")
    num_out = num_out_for(mode, len(order))
    n = len(order) if num_out < 0 else num_out
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(dtype).requires_grad_()
    x64 = x.detach().double().requires_grad_()

    # permute
    out, row_id_map = te.moe_permute(x, table, num_out_tokens=num_out, map_type=map_type)
    ref_out, _ = ref_permute(x64, order, n)
    assert out.shape == (n, H) and out.dtype == dtype
    assert torch.equal(out.double(), ref_out), "permuted rows"
    cot = torch.randn(n, H, generator=g).to(dtype)
    (gx,) = grads([out], [x], [cot])
    (gx_ref,) = grads([ref_out], [x64], [cot.double()])
    close(gx, gx_ref, dtype, "d inp (permute)")

    # unpermute of other rows, with and without merging probs
    y = torch.randn(n, H, generator=g).to(dtype).requires_grad_()
    y64 = y.detach().double().requires_grad_()
    cot = torch.randn(T, H, generator=g).to(dtype)
    for with_probs in (False, True):
        m = router_probs(rows, map_type, torch.float32, seed).requires_grad_() if with_probs else None
        m64 = m.detach().double().requires_grad_() if with_probs else None
        got = te.moe_unpermute(y, row_id_map, m, restore_shape=x.shape, map_type=map_type)
        want = ref_unpermute(y64, order[:n], T, m64)
        assert got.shape == (T, H) and got.dtype == dtype
        close(got, want, dtype, f"unpermute (probs={with_probs})")
        ins, ins64 = [y] + ([m] if with_probs else []), [y64] + ([m64] if with_probs else [])
        names = ["d inp", "d probs"][: len(ins)]
        for a, b, name in zip(
            grads([got], ins, [cot]), grads([want], ins64, [cot.double()]), names, strict=True
        ):
            close(a, b, dtype, f"{name} (unpermute, probs={with_probs})")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("mode", ["all", "drop", "pad"])
@pytest.mark.parametrize("topk", [1, 3])
def test_permute_with_probs_matches_the_reference(topk, mode, dtype):
    table, rows = routing("mask", topk, seed=topk * 7 + len(mode))
    order = ref_order("mask", rows)
    num_out = num_out_for(mode, len(order))
    n = len(order) if num_out < 0 else num_out
    g = torch.Generator().manual_seed(3)
    x = torch.randn(T, H, generator=g).to(dtype).requires_grad_()
    probs = router_probs(rows, "mask", dtype, seed=4, zero_slot=True).requires_grad_()
    x64, p64 = (v.detach().double().requires_grad_() for v in (x, probs))

    out, pp, row_id_map = te.moe_permute_with_probs(x, probs, table, num_out_tokens=num_out)
    ref_out, ref_pp = ref_permute(x64, order, n, p64)
    assert out.shape == (n, H) and pp.shape == (n,) and pp.dtype == dtype
    assert torch.equal(out.double(), ref_out), "permuted rows (a zero row for the zero probability)"
    assert torch.equal(pp.double(), ref_pp), "permuted probs"
    assert (ref_out == 0).all(1).any(), "the zero-probability slot is among the rows"
    cots = [torch.randn(n, H, generator=g).to(dtype), torch.randn(n, generator=g).to(dtype)]
    got = grads([out, pp], [x, probs], cots)
    want = grads([ref_out, ref_pp], [x64, p64], [c.double() for c in cots])
    for a, b, name in zip(got, want, ["d inp", "d probs"], strict=True):
        close(a, b, dtype, name)

    # the same map without probs permutes identically but for the zero row
    plain, plain_map = te.moe_permute(x, table, num_out_tokens=num_out)
    assert torch.equal(plain_map, row_id_map)
    differ = (plain != out).any(1)
    assert int(differ.sum()) <= 1 and (out[differ] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("map_type", ["mask", "index"])
def test_round_trip_with_probs_summing_to_one(map_type, dtype):
    table, rows = routing(map_type, 3, seed=11)
    x = torch.randn(T, H, dtype=torch.float32).to(dtype).requires_grad_()
    probs = router_probs(rows, map_type, torch.float32, seed=12).requires_grad_()
    permuted, row_id_map = te.moe_permute(x, table, map_type=map_type)
    back = te.moe_unpermute(permuted, row_id_map, probs, map_type=map_type)
    routed = torch.ones(T, dtype=torch.bool)
    if map_type == "mask":
        routed[[0, 5]] = False
    close(back[routed], x.detach()[routed], dtype, "unpermute(permute(x))")
    assert not back[~routed].any(), "tokens routed nowhere come back as zeros"
    cot = torch.randn(T, H).to(dtype)
    gx, gp = grads([back], [x, probs], [cot])
    close(gx[routed], cot[routed], dtype, "d x of the round trip: the probs sum to 1")
    assert not gx[~routed].any()
    want = (cot.double() * x.detach().double()).sum(1, keepdim=True) * (probs.detach() != 0)
    close(gp, want, dtype, "d probs of the round trip")


def test_an_index_map_without_merging_probs_sums_the_tokens_rows():
    # TE's kernel returns num_tokens * topK rows here (its tests skip the case); te sums them, as a
    # mask map without merging probs does
    table, _ = routing("index", 2, seed=5)
    x = torch.randn(T, H)
    permuted, row_id_map = te.moe_permute(x, table, map_type="index")
    torch.testing.assert_close(te.moe_unpermute(permuted, row_id_map, map_type="index"), 2 * x)


def test_autograd_gradcheck_fp64():
    table, rows = routing("mask", 2, seed=8, num_tokens=7)
    x = torch.randn(7, 3, dtype=torch.float64, requires_grad=True)
    probs = router_probs(rows, "mask", torch.float64, seed=9).requires_grad_()
    merging = router_probs(rows, "mask", torch.float64, seed=10).requires_grad_()
    routed = int(table.sum())

    def f(x, probs, merging):
        out, pp, row_id_map = te.moe_permute_with_probs(x, probs, table, num_out_tokens=routed - 2)
        out, pp = te.moe_sort_chunks_by_index_with_probs(
            out, pp, torch.tensor([3, 0, routed - 5]), torch.tensor([2, 1, 0])
        )
        out = te.moe_sort_chunks_by_index(
            out * pp.unsqueeze(-1), torch.tensor([routed - 5, 0, 3]), torch.tensor([2, 1, 0])
        )
        return te.moe_unpermute(out, row_id_map, merging, restore_shape=x.shape)

    assert torch.autograd.gradcheck(f, (x, probs, merging))


# -- chunk sort -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("seed", range(4))
def test_sort_chunks_matches_the_reference(seed, dtype):
    rng = random.Random(seed)
    chunks = rng.randint(1, 9)
    sizes = [rng.choice([0, 0, 1, 2, 5]) for _ in range(chunks)]
    order = list(range(chunks))
    rng.shuffle(order)
    rows = sum(sizes)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, H, generator=g).to(dtype).requires_grad_()
    probs = torch.rand(rows, generator=g).requires_grad_()
    x64, p64 = (v.detach().double().requires_grad_() for v in (x, probs))
    index_dtype = [torch.int32, torch.int64][seed % 2]
    split, sort = torch.tensor(sizes, dtype=index_dtype), torch.tensor(order, dtype=index_dtype)
    src, want = ref_sort_chunks(x64, sizes, order)
    got = te.moe_sort_chunks_by_index(x, split, sort)
    assert torch.equal(got.double(), want)
    got2, pp = te.moe_sort_chunks_by_index_with_probs(x, probs, sizes, order)  # lists work too
    assert torch.equal(got2, got) and torch.equal(pp.double(), p64.detach()[src])
    cots = [torch.randn(rows, H, generator=g).to(dtype), torch.randn(rows, generator=g)]
    (gx,) = grads([got], [x], cots[:1])
    (gx_ref,) = grads([want], [x64], [cots[0].double()])
    assert torch.equal(gx.double(), gx_ref)
    gx2, gp = grads([got2, pp], [x, probs], cots)
    assert torch.equal(gx2, gx) and torch.equal(gp.double(), grads([p64[src]], [p64], [cots[1].double()])[0])


# -- empty inputs ---------------------------------------------------------------------------------


@pytest.mark.parametrize("map_type", ["mask", "index"])
def test_empty_inputs(map_type):
    for tokens, hidden in [(0, H), (4, 0), (0, 0)]:
        x = torch.randn(tokens, hidden, requires_grad=True)
        table = torch.zeros(tokens, E if map_type == "mask" else 2, dtype=torch.int64)
        for num_out in (-1, 0, 3):
            out, row_id_map = te.moe_permute(x, table, num_out_tokens=num_out, map_type=map_type)
            n = (0 if map_type == "mask" else tokens * 2) if num_out < 0 else num_out
            assert out.shape == (n, hidden) and not out.any()
            assert row_id_map.shape == table.shape
            back = te.moe_unpermute(out, row_id_map, torch.zeros(table.shape), map_type=map_type)
            assert back.shape == (tokens, hidden)
            back.sum().backward()
    x = torch.zeros(0, H, requires_grad=True)
    probs = torch.zeros(0, E, requires_grad=True)
    out, pp, row_id_map = te.moe_permute_with_probs(x, probs, torch.zeros(0, E, dtype=torch.bool))
    assert out.shape == (0, H) and pp.shape == (0,)
    (out.sum() + pp.sum()).backward()
    assert x.grad.shape == x.shape and probs.grad.shape == probs.shape
    out, pp = te.moe_sort_chunks_by_index_with_probs(
        x, torch.zeros(0), torch.tensor([0, 0]), torch.tensor([1, 0])
    )
    assert out.shape == (0, H) and pp.shape == (0,)
    assert te.moe_sort_chunks_by_index(
        x, torch.zeros(0, dtype=torch.int32), torch.zeros(0, dtype=torch.int32)
    ).shape == (0, H)


def test_everything_dropped_unpermutes_to_zeros():
    table, _ = routing("mask", 2, seed=1)
    x = torch.randn(T, H, requires_grad=True)
    out, row_id_map = te.moe_permute(x, table, num_out_tokens=0)
    assert out.shape == (0, H) and (row_id_map == -1).all()
    back = te.moe_unpermute(out, row_id_map, restore_shape=(T, H))
    assert back.shape == (T, H) and not back.any()


def test_no_device_value_is_read_but_a_mask_maps_routed_count():
    # meta tensors have shapes but no values: any host read of one raises, so running every op
    # forward and backward on them shows that nothing would synchronize with a GPU
    d, k = "meta", 2
    x = torch.empty(T, H, device=d, requires_grad=True)
    probs = torch.empty(T, E, device=d, requires_grad=True)
    mask = torch.empty(T, E, dtype=torch.bool, device=d)
    index = torch.empty(T, k, dtype=torch.int32, device=d)
    out, pp, row_id_map = te.moe_permute_with_probs(x, probs, mask, num_out_tokens=30)
    back = te.moe_unpermute(out, row_id_map, probs, restore_shape=x.shape)
    out2, row_id_map2 = te.moe_permute(x, index, map_type="index")  # -1: T * topK rows, no read
    chunks = torch.empty(4, dtype=torch.int64, device=d)
    out2 = te.moe_sort_chunks_by_index(out2, chunks, chunks)
    back2 = te.moe_unpermute(out2, row_id_map2, torch.empty(T, k, device=d), map_type="index")
    assert out.shape == (30, H) and pp.shape == (30,) and back.shape == back2.shape == (T, H)
    (back.sum() + back2.sum() + pp.sum()).backward()
    assert x.grad.shape == x.shape and probs.grad.shape == probs.shape
    with pytest.raises(RuntimeError, match="meta"):  # the routed count is the output's row count
        te.moe_permute(x, mask)


# -- quantized inputs -----------------------------------------------------------------------------

QUANTIZERS = {
    "current": lambda: te.Float8CurrentScalingQuantizer(torch.float8_e4m3fn, "cpu"),
    "current_colwise": lambda: te.Float8CurrentScalingQuantizer(torch.float8_e5m2, "cpu", rowwise=False),
    "block1d": lambda: te.Float8BlockQuantizer(torch.float8_e4m3fn, block_scaling_dim=1),
    "mxfp8": lambda: te.MXFP8Quantizer(torch.float8_e4m3fn),
    "nvfp4": lambda: te.NVFP4Quantizer(),
}
TQ, HQ = 24, 128  # NVFP4's column-wise copy packs row pairs


def row_parts(q):
    """(row-wise bytes [M, ...], row-wise scales one row a token or None) of a quantized tensor."""
    if isinstance(q, te.Float8Tensor):
        data = q._data if q._data is not None else q._transpose.t()
        return data.view(torch.uint8), None
    m = q.shape[0]
    rs = q._rowwise_scale_inv
    scales = rs[:, :m].t() if isinstance(q, te.Float8BlockwiseQTensor) else rs[:m]
    return q._rowwise_data.view(torch.uint8), scales


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_quantized_rows_move_exactly(name):
    table, rows = routing("mask", 2, seed=21, num_tokens=TQ)
    order = ref_order("mask", rows)
    n = len(order) + 2  # two zero rows past the routed count
    # rows of different magnitudes: every row (and block) has a scale of its own
    x = (torch.randn(TQ, HQ) * 4.0 ** (torch.arange(TQ) % 6).unsqueeze(-1)).to(torch.bfloat16)
    q = QUANTIZERS[name]()(x).requires_grad_()
    out, row_id_map = te.moe_permute(q, table, num_out_tokens=n)
    assert type(out) is type(q) and out.shape == (n, HQ) and out.dtype == torch.bfloat16
    data, scales = row_parts(q)
    out_data, out_scales = row_parts(out)
    for r, (t, _) in enumerate(order):
        assert torch.equal(out_data[r], data[t]), r
        if scales is not None:
            assert torch.equal(out_scales[r], scales[t]), r
            assert t == 0 or not torch.equal(scales[t], scales[t - 1]), "the scales tell the rows apart"
    assert not out_data[len(order) :].any()
    if scales is None:
        assert out._scale_inv is q._scale_inv
    plain = q.dequantize()
    want, want_map = te.moe_permute(plain, table, num_out_tokens=n)
    assert torch.equal(out.dequantize(), want) and torch.equal(row_id_map, want_map)

    # gradients are high precision, the plain path's
    cot = torch.randn(n, HQ, dtype=torch.bfloat16)
    (got,) = torch.autograd.grad(out, q, cot)
    p = plain.clone().requires_grad_()
    (ref,) = torch.autograd.grad(te.moe_permute(p, table, num_out_tokens=n)[0], p, cot)
    assert type(got) is torch.Tensor and torch.equal(got, ref)

    # with probs (a zero-probability slot: zero bytes), chunk sort, and unpermute (dequantized)
    probs = router_probs(rows, "mask", torch.float32, seed=22, zero_slot=True)
    out_p, pp, _ = te.moe_permute_with_probs(q, probs, table)
    assert torch.equal(out_p.dequantize(), te.moe_permute_with_probs(plain, probs, table)[0])
    sizes, idx = torch.tensor([5, 0, n - 5]), torch.tensor([2, 0, 1])
    assert torch.equal(
        te.moe_sort_chunks_by_index(out, sizes, idx).dequantize(),
        te.moe_sort_chunks_by_index(want, sizes, idx),
    )
    merged = te.moe_unpermute(out, row_id_map, probs)
    assert type(merged) is torch.Tensor and torch.equal(merged, te.moe_unpermute(want, row_id_map, probs))


@pytest.mark.parametrize(
    "quantizer, what",
    [
        (lambda: te.Float8BlockQuantizer(torch.float8_e4m3fn, block_scaling_dim=2), "with 2-D blocks"),
        (
            lambda: te.Float8BlockQuantizer(torch.float8_e4m3fn, rowwise=False, block_scaling_dim=1),
            "without its row-wise copy",
        ),
        (lambda: te.MXFP8Quantizer(torch.float8_e4m3fn, with_2d_quantization=True), "with 2-D blocks"),
        (lambda: te.MXFP8Quantizer(torch.float8_e4m3fn, rowwise=False), "without its row-wise copy"),
        (lambda: te.NVFP4Quantizer(with_2d_quantization=True), "with 2-D blocks"),
    ],
    ids=["block2d", "block1d_colwise", "mxfp8_2d", "mxfp8_colwise", "nvfp4_2d"],
)
def test_quantized_layouts_that_cannot_move_exactly_raise(quantizer, what):
    q = quantizer()(torch.randn(TQ, HQ))
    name = type(q).__name__
    table, _ = routing("mask", 1, seed=2, num_tokens=TQ)
    with pytest.raises(NotImplementedError, match=f"moe_permute: inp: a {name} {what}"):
        te.moe_permute(q, table)
    with pytest.raises(NotImplementedError, match=f"moe_sort_chunks_by_index: inp: a {name} {what}"):
        te.moe_sort_chunks_by_index(q, torch.tensor([TQ]), torch.tensor([0]))


# -- TE's interface -------------------------------------------------------------------------------


def test_te_signature_defaults_and_the_old_probs_name():
    table, rows = routing("mask", 2, seed=3)
    x = torch.randn(T, H)
    out, row_id_map = te.moe_permute(x, table, -1, -1, "mask")
    assert out.shape[0] == int(table.sum())
    merging = router_probs(rows, "mask", torch.float32, seed=4)
    want = te.moe_unpermute(out, row_id_map, merging_probs=merging)
    with pytest.warns(DeprecationWarning, match="moe_unpermute: probs is deprecated; use merging_probs"):
        got = te.moe_unpermute(out, row_id_map, probs=merging)
    assert torch.equal(got, want)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        te.moe_permute(x, table.to(torch.int32), max_token_num=4096)  # TE warns for non-int32 maps
    names = ["moe_permute", "moe_permute_with_probs", "moe_unpermute", "moe_sort_chunks_by_index"]
    assert all(
        n in te.__all__ and callable(getattr(te, n)) for n in [*names, "moe_sort_chunks_by_index_with_probs"]
    )


def _errors():
    x = torch.randn(5, 4)
    mask = torch.tensor([[1, 0, 1]] * 5, dtype=torch.bool)
    index = torch.tensor([[0, 2]] * 5)
    probs = torch.rand(5, 3)
    out, row_id_map = te.moe_permute(x, mask)
    P, U, S = te.moe_permute, te.moe_unpermute, te.moe_sort_chunks_by_index
    return [
        (lambda: P(x.tolist(), mask), TypeError, "moe_permute: inp: expected a torch.Tensor, got list"),
        (
            lambda: P(x[None], mask),
            ValueError,
            r"moe_permute: inp: expected a 2-D tensor \[num_tokens, hidden_size\], got shape \(1, 5, 4\)",
        ),
        (
            lambda: P(x.int(), mask),
            TypeError,
            "moe_permute: inp: expected float32, bfloat16, float16 or float64, got torch.int32",
        ),
        (
            lambda: P(x, mask[:4]),
            ValueError,
            r"moe_permute: routing_map: expected a \[num_tokens, num_experts\] mask with num_tokens=5 \(inp's rows\), got shape \(4, 3\)",
        ),
        (
            lambda: P(x, mask.float()),
            TypeError,
            "moe_permute: routing_map: expected a bool or integer tensor",
        ),
        (
            lambda: P(x, mask, map_type="index"),
            TypeError,
            r"moe_permute: routing_map: expected an integer tensor \(\[num_tokens, topK\] expert indices\), got torch.bool",
        ),
        (
            lambda: P(x, index[:, 0], map_type="index"),
            ValueError,
            r"expected a \[num_tokens, topK\] expert indices with num_tokens=5",
        ),
        (
            lambda: P(x, index - 1, map_type="index"),
            ValueError,
            "moe_permute: routing_map: expected expert indices >= 0, got -1",
        ),
        (
            lambda: P(x, mask, map_type="dense"),
            ValueError,
            "moe_permute: map_type: expected 'mask' or 'index', got 'dense'",
        ),
        (
            lambda: P(x, mask, num_out_tokens=2.0),
            TypeError,
            r"moe_permute: num_out_tokens: expected an int \(-1: every routed token\), got float 2.0",
        ),
        (lambda: P(x, mask, num_out_tokens=True), TypeError, "moe_permute: num_out_tokens: expected an int"),
        (lambda: P(x, mask, max_token_num=None), TypeError, "moe_permute: max_token_num: expected an int"),
        (
            lambda: P(x, mask.to("meta")),
            ValueError,
            r"moe_permute: routing_map: expected a tensor on cpu \(inp's device\), got one on meta",
        ),
        (
            lambda: te.moe_permute_with_probs(x, mask, probs),
            TypeError,
            "moe_permute_with_probs: routing_map: expected a bool or integer tensor",
        ),  # TE's argument order, swapped
        (
            lambda: te.moe_permute_with_probs(x, mask.int(), mask),
            TypeError,
            "moe_permute_with_probs: probs: expected a floating-point tensor, got torch.int32",
        ),
        (
            lambda: te.moe_permute_with_probs(x, probs[:, :2], mask),
            ValueError,
            r"moe_permute_with_probs: probs: expected shape \[5, 3\] \(routing_map's shape\), got \(5, 2\)",
        ),
        (
            lambda: te.moe_permute_with_probs(x, None, mask),
            TypeError,
            "moe_permute_with_probs: probs: expected a torch.Tensor, got NoneType",
        ),
        (
            lambda: U(out, row_id_map.long()),
            ValueError,
            r"moe_unpermute: row_id_map: expected moe_permute's \(an int32 \[num_tokens, slots\] tensor\), got a torch.int64",
        ),
        (
            lambda: U(out, row_id_map, restore_shape=(4, 4)),
            ValueError,
            r"moe_unpermute: restore_shape: expected \(5, 4\) \(row_id_map's tokens, inp's hidden size\), got \(4, 4\)",
        ),
        (
            lambda: U(out, row_id_map, probs[:, :2]),
            ValueError,
            r"moe_unpermute: merging_probs: expected shape \[5, 3\] \(\[num_tokens, num_experts\]\), got \(5, 2\)",
        ),
        (lambda: U(out, row_id_map, probs[:, :2], map_type="index"), ValueError, r"\(\[num_tokens, topK\]\)"),
        (
            lambda: U(out[:9], row_id_map),
            ValueError,
            r"moe_unpermute: inp: expected the 10\+ rows moe_permute made \(num_out_tokens\), got 9",
        ),
        (
            lambda: U(out, row_id_map, probs, probs=probs),
            ValueError,
            "moe_unpermute: merging_probs and probs both given",
        ),
        (
            lambda: U(out, row_id_map, map_type="sparse"),
            ValueError,
            "moe_unpermute: map_type: expected 'mask' or 'index'",
        ),
        (
            lambda: U(out, row_id_map.to("meta")),
            ValueError,
            "moe_unpermute: row_id_map: expected a tensor on cpu",
        ),
        (
            lambda: S(x, torch.tensor([2, 2]), torch.tensor([1, 0])),
            ValueError,
            r"moe_sort_chunks_by_index: split_sizes: expected sizes >= 0 summing to 5 \(inp's rows\), got \[2, 2\]",
        ),
        (
            lambda: S(x, torch.tensor([6, -1]), torch.tensor([1, 0])),
            ValueError,
            "split_sizes: expected sizes >= 0 summing to 5",
        ),
        (
            lambda: S(x, torch.tensor([2, 3]), torch.tensor([1, 1])),
            ValueError,
            r"moe_sort_chunks_by_index: sorted_index: expected a permutation of 0..1, got \[1, 1\]",
        ),
        (
            lambda: S(x, torch.tensor([2, 3]), torch.tensor([1, 0, 2])),
            ValueError,
            r"sorted_index: expected one index per chunk \(2, split_sizes' length\), got 3",
        ),
        (
            lambda: S(x, torch.tensor([2.0, 3.0]), torch.tensor([1, 0])),
            TypeError,
            "moe_sort_chunks_by_index: split_sizes: expected a 1-D integer tensor, got a torch.float32",
        ),
        (
            lambda: S(x, 5, torch.tensor([0])),
            TypeError,
            "split_sizes: expected a 1-D integer tensor or a list of ints, got int",
        ),
        (
            lambda: S(x, torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)),
            ValueError,
            r"split_sizes: expected chunk sizes summing to 5 \(inp's rows\), got none",
        ),
        (
            lambda: te.moe_sort_chunks_by_index_with_probs(x, probs, [5], [0]),
            ValueError,
            r"moe_sort_chunks_by_index_with_probs: probs: expected shape \[5\] \(one per row of inp\), got \(5, 3\)",
        ),
    ]


@pytest.mark.parametrize("case", range(len(_errors())))
def test_errors_name_the_argument(case):
    fn, exc, msg = _errors()[case]
    with pytest.raises(exc, match=msg):
        fn()


# -- permute and pad ------------------------------------------------------------------------------


def ref_padded_order(mask: list, align: int):
    """(token, expert) of each padded row, None for a pad row (each expert's tokens, then pad rows
    until its group's size is a multiple of align), the padded counts and the pad offsets (the
    pad rows before each expert's group)."""
    order, target, offsets, pads = [], [], [], 0
    for e in range(len(mask[0]) if mask else E):
        group = [(t, e) for t in range(len(mask)) if mask[t][e]]
        size = len(group)
        while size % align:
            size += 1
        offsets.append(pads)
        pads += size - len(group)
        order += group + [None] * (size - len(group))
        target.append(size)
    return order, target, offsets


def ref_permute_padded(x, probs, order):
    """The padded rows and probs of x64 [T, H] (differentiable, fp64): zero rows and zero probs
    for pad rows, a zero row for a routed slot of probability 0."""
    zero = x.new_zeros(x.shape[1])
    rows, pp = [], []
    for item in order:
        if item is None:
            rows.append(zero)
            pp.append(probs.new_zeros(()))
            continue
        t, e = item
        rows.append(zero if float(probs[t, e].detach()) == 0.0 else x[t])
        pp.append(probs[t, e])
    if not rows:
        return x.new_zeros(0, x.shape[1]), probs.new_zeros(0)
    return torch.stack(rows), torch.stack(pp)


def ref_unpermute_padded(y, order, num_tokens, merging):
    """out[t] = sum of merging[t, e] * y[r] over the rows r = (t, e) of token t; pad rows left out."""
    out = [y.new_zeros(y.shape[1]) for _ in range(num_tokens)]
    for r, item in enumerate(order):
        if item is not None:
            t, e = item
            out[t] = out[t] + merging[t, e] * y[r]
    return torch.stack(out)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("align", [1, 3, 4, 16])
@pytest.mark.parametrize("topk", [1, 3])
def test_permute_and_pad_matches_the_reference(topk, align, dtype):
    seed = 31 * topk + align + DTYPES.index(dtype)
    table, rows = routing("mask", topk, seed)
    order, target, offsets = ref_padded_order(rows, align)
    n = len(order)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(dtype).requires_grad_()
    probs = router_probs(rows, "mask", dtype, seed=seed + 1, zero_slot=True).requires_grad_()
    x64, p64 = (v.detach().double().requires_grad_() for v in (x, probs))
    counts = table.sum(0).to([torch.int64, torch.int32][align % 2])

    out, pp, row_id_map, pad_offsets, target_got = te.moe_permute_and_pad_with_probs(
        x, probs, table, counts, align
    )
    ref_out, ref_pp = ref_permute_padded(x64, p64, order)
    assert out.shape == (n, H) and out.dtype == dtype and pp.shape == (n,) and pp.dtype == dtype
    assert torch.equal(out.double(), ref_out), "padded rows"
    assert torch.equal(pp.double(), ref_pp), "padded probs"
    pad = torch.tensor([item is None for item in order], dtype=torch.bool)
    assert not out[pad].any() and not pp[pad].any(), "pad rows and their probs are zeros"
    assert target_got.dtype == torch.int64 and target_got.tolist() == target
    if n == int(table.sum()):
        assert pad_offsets is None, "no group needs padding: no offsets (TE's None)"
    else:
        assert pad_offsets.dtype == torch.int64 and pad_offsets.tolist() == offsets
    assert torch.equal(row_id_map, te.moe_permute_with_probs(x, probs, table)[2]), "the unpadded map"

    cots = [torch.randn(n, H, generator=g).to(dtype), torch.randn(n, generator=g).to(dtype)]
    got = grads([out, pp], [x, probs], cots)
    want = grads([ref_out, ref_pp], [x64, p64], [c.double() for c in cots])
    for a, b, name in zip(got, want, ["d inp", "d probs"], strict=True):
        close(a, b, dtype, f"{name} (permute and pad)")

    # unpermute of other rows through the padded layout; pad rows are left out
    y = torch.randn(n, H, generator=g).to(dtype).requires_grad_()
    merging = router_probs(rows, "mask", torch.float32, seed=seed + 2).requires_grad_()
    y64, m64 = (v.detach().double().requires_grad_() for v in (y, merging))
    back = te.moe_unpermute(y, row_id_map, merging, restore_shape=x.shape, pad_offsets=pad_offsets)
    want = ref_unpermute_padded(y64, order, T, m64)
    assert back.shape == (T, H) and back.dtype == dtype
    close(back, want, dtype, "unpermute with pad_offsets")
    cot = torch.randn(T, H, generator=g).to(dtype)
    gy, gm = grads([back], [y, merging], [cot])
    gy_ref, gm_ref = grads([want], [y64, m64], [cot.double()])
    close(gy, gy_ref, dtype, "d inp (unpermute with pad_offsets)")
    close(gm, gm_ref, dtype, "d merging_probs (unpermute with pad_offsets)")
    assert not gy[pad].any(), "pad rows take no gradient"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("align", [2, 8])
def test_padded_round_trip_equals_the_unpadded_path(align, dtype):
    table, rows = routing("mask", 2, seed=40 + align)
    g = torch.Generator().manual_seed(align)
    x0 = torch.randn(T, H, generator=g).to(dtype)
    p0 = router_probs(rows, "mask", torch.float32, seed=41, zero_slot=True)
    m0 = router_probs(rows, "mask", torch.float32, seed=42)
    cot = torch.randn(T, H, generator=g).to(dtype)

    def run(padded: bool):
        x, probs, merging = (v.clone().requires_grad_() for v in (x0, p0, m0))
        pad_offsets = None
        if padded:
            out, pp, row_id_map, pad_offsets, _ = te.moe_permute_and_pad_with_probs(
                x, probs, table, table.sum(0), align
            )
        else:
            out, pp, row_id_map = te.moe_permute_with_probs(x, probs, table)
        y = (out * 2 + 1) * pp.unsqueeze(-1).to(dtype) + 0.5  # an expert: pad rows become nonzero
        back = te.moe_unpermute(y, row_id_map, merging, restore_shape=x.shape, pad_offsets=pad_offsets)
        gx, gp, gm = torch.autograd.grad(back, [x, probs, merging], cot)
        return back, gx, gp, gm, (y, row_id_map, pad_offsets)

    *padded, (y, row_id_map, pad_offsets) = run(True)
    *plain, _ = run(False)
    assert pad_offsets is not None and y.shape[0] > int(table.sum()), "some group is padded"
    for a, b, name in zip(padded, plain, ["output", "d inp", "d probs", "d merging_probs"], strict=True):
        assert torch.equal(a, b), name
    # without the offsets the same rows are read from the wrong places
    assert not torch.equal(te.moe_unpermute(y.detach(), row_id_map, m0), padded[0])


def test_align_size_one_or_aligned_counts_pad_nothing():
    table, rows = routing("mask", 3, seed=50)
    x = torch.randn(T, H)
    probs = router_probs(rows, "mask", torch.float32, seed=51)
    want = te.moe_permute_with_probs(x, probs, table)
    out, pp, row_id_map, pad_offsets, target = te.moe_permute_and_pad_with_probs(
        x, probs, table, table.sum(0), 1
    )
    assert pad_offsets is None and torch.equal(target, table.sum(0))
    for a, b in zip((out, pp, row_id_map), want, strict=True):
        assert torch.equal(a, b)
    # counts already multiples of align_size: nothing to pad either; one short of it: pad rows
    full = torch.ones(4, 3, dtype=torch.bool)
    x4, p4 = torch.randn(4, H), torch.full((4, 3), 1 / 3)
    for align, offsets in [(2, None), (4, None), (3, [0, 2, 4]), (5, [0, 1, 2])]:
        out, _, _, pad_offsets, target = te.moe_permute_and_pad_with_probs(x4, p4, full, full.sum(0), align)
        size = -(-4 // align) * align
        assert target.tolist() == [size] * 3 and out.shape == (3 * size, H)
        assert (pad_offsets is None) == (offsets is None)
        assert offsets is None or pad_offsets.tolist() == offsets


def test_permute_and_pad_gradcheck_fp64():
    table, rows = routing("mask", 2, seed=52, num_tokens=7)
    x = torch.randn(7, 3, dtype=torch.float64, requires_grad=True)
    probs = router_probs(rows, "mask", torch.float64, seed=53).requires_grad_()
    merging = router_probs(rows, "mask", torch.float64, seed=54).requires_grad_()

    def f(x, probs, merging):
        out, pp, row_id_map, pad_offsets, _ = te.moe_permute_and_pad_with_probs(
            x, probs, table, table.sum(0), 4
        )
        return te.moe_unpermute(out * pp.unsqueeze(-1), row_id_map, merging, pad_offsets=pad_offsets)

    assert torch.autograd.gradcheck(f, (x, probs, merging))


def test_permute_and_pad_empty_inputs():
    for tokens, experts, hidden in [(0, E, H), (4, E, 0), (4, 0, H), (0, 0, 0)]:
        x = torch.randn(tokens, hidden, requires_grad=True)
        probs = torch.zeros(tokens, experts, requires_grad=True)
        table = torch.zeros(tokens, experts, dtype=torch.bool)
        out, pp, row_id_map, pad_offsets, target = te.moe_permute_and_pad_with_probs(
            x, probs, table, table.sum(0), 16
        )
        assert out.shape == (0, hidden) and pp.shape == (0,) and pad_offsets is None
        assert target.shape == (experts,) and row_id_map.shape == table.shape
        back = te.moe_unpermute(out, row_id_map, probs, restore_shape=x.shape)
        assert back.shape == (tokens, hidden)
        (back.sum() + pp.sum()).backward()
        assert x.grad.shape == x.shape and probs.grad.shape == probs.shape


def test_permute_and_pad_reads_the_row_count_on_the_host_and_returns_on_inps_device():
    # TE moves tokens_per_expert to inp's device (here: the meta device, read on the host)
    table, rows = routing("mask", 2, seed=55)
    x = torch.randn(T, H, device="meta")
    probs = torch.rand(T, E, device="meta")
    with pytest.raises(RuntimeError, match="meta"):  # the padded row count is read on the host
        te.moe_permute_and_pad_with_probs(x, probs, table.to("meta"), table.sum(0), 4)
    x, probs = torch.randn(T, H), router_probs(rows, "mask", torch.float32, seed=56)
    *_, pad_offsets, target = te.moe_permute_and_pad_with_probs(x, probs, table, table.sum(0).int(), 4)
    assert pad_offsets.device == target.device == x.device


@pytest.mark.parametrize("name", ["current", "block1d", "mxfp8", "nvfp4"])
def test_permute_and_pad_moves_quantized_rows(name):
    table, rows = routing("mask", 2, seed=57, num_tokens=TQ)
    order, _, _ = ref_padded_order(rows, 16)
    x = (torch.randn(TQ, HQ) * 4.0 ** (torch.arange(TQ) % 6).unsqueeze(-1)).to(torch.bfloat16)
    q = QUANTIZERS[name]()(x)
    probs = router_probs(rows, "mask", torch.float32, seed=58)
    out, pp, row_id_map, pad_offsets, _ = te.moe_permute_and_pad_with_probs(q, probs, table, table.sum(0), 16)
    assert type(out) is type(q) and out.shape == (len(order), HQ)
    data, scales = row_parts(q)
    out_data, out_scales = row_parts(out)
    for r, item in enumerate(order):
        if item is None:
            assert not out_data[r].any(), r
            continue
        assert torch.equal(out_data[r], data[item[0]]), r
        if scales is not None:
            assert torch.equal(out_scales[r], scales[item[0]]), r
    plain = te.moe_permute_and_pad_with_probs(q.dequantize(), probs, table, table.sum(0), 16)
    assert torch.equal(out.dequantize(), plain[0]) and torch.equal(pp, plain[1])
    merged = te.moe_unpermute(out, row_id_map, probs, pad_offsets=pad_offsets)
    assert torch.equal(merged, te.moe_unpermute(plain[0], row_id_map, probs, pad_offsets=pad_offsets))


def test_permute_and_pad_te_signature():
    assert "moe_permute_and_pad_with_probs" in te.__all__
    table, rows = routing("mask", 2, seed=59)
    x, probs = torch.randn(T, H), router_probs(rows, "mask", torch.float32, seed=60)
    by_name = te.moe_permute_and_pad_with_probs(
        inp=x, probs=probs, routing_map=table, tokens_per_expert=table.sum(0), align_size=8
    )
    assert len(by_name) == 5
    for a, b in zip(
        by_name, te.moe_permute_and_pad_with_probs(x, probs, table, table.sum(0), 8), strict=True
    ):
        assert torch.equal(a, b)


def _pad_errors():
    x = torch.randn(5, 4)
    mask = torch.tensor([[1, 0, 1]] * 4 + [[0, 1, 1]], dtype=torch.bool)
    probs = torch.rand(5, 3) * mask
    counts = mask.sum(0)  # [4, 1, 5]
    PP, U = te.moe_permute_and_pad_with_probs, te.moe_unpermute
    out, _, row_id_map, pad_offsets, _ = PP(x, probs, mask, counts, 4)  # 16 rows, offsets [0, 0, 3]
    owner = "moe_permute_and_pad_with_probs"
    return [
        (
            lambda: PP(x, probs, mask, counts, 0),
            ValueError,
            rf"{owner}: align_size: expected an int >= 1 \(the row multiple of each expert's group\), got 0",
        ),
        (lambda: PP(x, probs, mask, counts, -16), ValueError, f"{owner}: align_size: expected an int >= 1"),
        (
            lambda: PP(x, probs, mask, counts, 16.0),
            TypeError,
            rf"{owner}: align_size: expected an int \(the row multiple of each expert's group\), got float",
        ),
        (
            lambda: PP(x, probs, mask, counts[:2], 4),
            ValueError,
            rf"{owner}: tokens_per_expert: expected shape \[3\] \(one per expert, routing_map.sum\(0\)\), got \(2,\)",
        ),
        (
            lambda: PP(x, probs, mask, counts[None], 4),
            ValueError,
            rf"{owner}: tokens_per_expert: expected shape \[3\] .*, got \(1, 3\)",
        ),
        (
            lambda: PP(x, probs, mask, counts.float(), 4),
            TypeError,
            rf"{owner}: tokens_per_expert: expected an integer tensor \(routing_map.sum\(0\)\), got torch.float32",
        ),
        (
            lambda: PP(x, probs, mask, counts.tolist(), 4),
            TypeError,
            f"{owner}: tokens_per_expert: expected a torch.Tensor, got list",
        ),
        (
            lambda: PP(x, probs, mask, torch.tensor([4, 2, 4]), 4),
            ValueError,
            rf"{owner}: tokens_per_expert: expected each expert's routed token count \(routing_map.sum\(0\)\); "
            "expert 1 has 1, got 2",
        ),
        (
            lambda: PP(x, probs, mask, torch.tensor([4, 1, -5]), 4),
            ValueError,
            "expert 2 has 5, got -5",
        ),
        (
            lambda: PP(x, probs[:, :2], mask, counts, 4),
            ValueError,
            rf"{owner}: probs: expected shape \[5, 3\] \(routing_map's shape\), got \(5, 2\)",
        ),
        (lambda: PP(x, None, mask, counts, 4), TypeError, f"{owner}: probs: expected a torch.Tensor"),
        (lambda: PP(x, probs, mask.float(), counts, 4), TypeError, f"{owner}: routing_map: expected a bool"),
        (lambda: PP(x, probs, mask[:4], counts, 4), ValueError, f"{owner}: routing_map: expected a"),
        (
            lambda: U(out, row_id_map, pad_offsets=pad_offsets[:2]),
            ValueError,
            r"moe_unpermute: pad_offsets: expected shape \[3\] \(one per expert, moe_permute_and_pad_with_probs.s\), got \(2,\)",
        ),
        (
            lambda: U(out, row_id_map, pad_offsets=pad_offsets.float()),
            TypeError,
            r"moe_unpermute: pad_offsets: expected an integer tensor \(moe_permute_and_pad_with_probs's\), got torch.float32",
        ),
        (
            lambda: U(out, row_id_map, pad_offsets=-pad_offsets),
            ValueError,
            "moe_unpermute: pad_offsets: expected offsets >= 0, got -3",
        ),
        (
            lambda: U(out, row_id_map, pad_offsets=pad_offsets.tolist()),
            TypeError,
            "moe_unpermute: pad_offsets: expected a torch.Tensor, got list",
        ),
        (
            lambda: U(out, row_id_map, pad_offsets=pad_offsets.to("meta")),
            ValueError,
            r"moe_unpermute: pad_offsets: expected a tensor on cpu \(inp's device\), got one on meta",
        ),
        (
            lambda: U(out, row_id_map, pad_offsets=pad_offsets, map_type="index"),
            ValueError,
            "moe_unpermute: pad_offsets: expected None with map_type='index'",
        ),
        (
            lambda: U(out[:12], row_id_map, pad_offsets=pad_offsets),
            ValueError,
            r"moe_unpermute: inp: expected the 13\+ rows moe_permute made \(num_out_tokens\), got 12",
        ),
    ]


@pytest.mark.parametrize("case", range(len(_pad_errors())))
def test_permute_and_pad_errors_name_the_argument(case):
    fn, exc, msg = _pad_errors()[case]
    with pytest.raises(exc, match=msg):
        fn()
