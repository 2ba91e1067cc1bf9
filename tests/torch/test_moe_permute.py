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
