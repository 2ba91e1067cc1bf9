"""te.MXFP8Quantizer / te.NVFP4Quantizer and the MXFP8Tensor / NVFP4Tensor they make, on CPU: the
values each copy holds against the plain-torch reference of _mx_ref.py (exactly: both are
"dequantize in fp32"; te-core's bits themselves are checked against an oracle in tests/core),
stochastic rounding's seeding, te.functional's GEMMs on these tensors, the tensors as torch
tensors (dispatch, copies, usage, save/load), and the errors."""

from __future__ import annotations

import io

import pytest
import te_torch as te
import torch
from _module_ref import rel
from _mx_ref import SIGNS, bf16, mxfp8_qdq, nvfp4_qdq, rht16
from te_core import _C
from te_torch import _kernels

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def source(shape, dtype=torch.float32, seed=0) -> torch.Tensor:
    """Normal values over a few decades per row, with exact zeros: blocks of very different
    scales, and an all-zero block."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2(
        torch.randint(-6, 7, (*shape[:-1], 1), generator=g).float()
    )
    x.view(-1)[: 2 * shape[-1] // 3] = 0.0
    return x.to(dtype)


def rows(x: torch.Tensor) -> torch.Tensor:
    return x.float().reshape(-1, x.shape[-1])


def unrht16(v: torch.Tensor) -> torch.Tensor:
    """The inverse of rht16 in te_dequantize's order (the butterfly, * 1/4, then the signs)."""
    h, w = 1, v.reshape(-1, 16)
    while h < 16:
        w = w.reshape(-1, 16 // (2 * h), 2, h)
        a, b = w[:, :, 0, :], w[:, :, 1, :]
        w = torch.stack((a + b, a - b), dim=2)
        h *= 2
    return (w.reshape(-1, 16) * 0.25 * SIGNS).reshape(v.shape)


def copy_of(q, x, row: bool):
    """``q``'s quantization of x with only one copy, dequantized to fp32 [..., K]."""
    q = q.copy()
    q.set_usage(rowwise=row, columnwise=not row)
    t = q(x)
    assert (t._rowwise_data is None) != row and (t._columnwise_data is None) == row
    return t, t.dequantize(torch.float32)


SHAPES = [(64, 96), (2, 32, 64), (40, 72)]  # the last one with edge blocks in both dims


@pytest.mark.parametrize("shape", SHAPES, ids=["2d", "3d", "edges"])
@pytest.mark.parametrize("tile", [False, True], ids=["1x32", "32x32"])
@pytest.mark.parametrize("fp8_dtype", [E4M3, E5M2], ids=["e4m3", "e5m2"])
def test_mxfp8_copies_match_the_reference(fp8_dtype, tile, shape):
    x = source(shape, torch.bfloat16, seed=1)
    q = te.MXFP8Quantizer(fp8_dtype, with_2d_quantization=tile)
    t = q(x)
    assert type(t) is te.MXFP8Tensor and t.shape == x.shape and t.dtype == torch.bfloat16
    m, k = rows(x).shape
    assert t._rowwise_data.dtype == fp8_dtype and t._rowwise_data.shape == x.shape
    assert t._columnwise_data.shape == (k, m)
    assert t._rowwise_scale_inv.dtype == torch.uint8

    def roundup(n, mult):
        return -(-n // mult) * mult

    assert t._rowwise_scale_inv.shape == (roundup(m, 128), roundup(roundup(k, 32) // 32, 4))
    _, row = copy_of(q, x, True)
    _, col = copy_of(q, x, False)
    assert torch.equal(rows(row), mxfp8_qdq(rows(x), fp8_dtype, tile))
    assert torch.equal(rows(col), mxfp8_qdq(rows(x).T, fp8_dtype, tile).T)
    if tile:  # 32x32 tiles: both copies hold the same values
        assert torch.equal(row, col)
    assert torch.equal(t.dequantize(torch.float32), row)  # the row-wise copy is read first


@pytest.mark.parametrize("shape", [(64, 96), (2, 16, 64), (48, 80)], ids=["2d", "3d", "odd_blocks"])
@pytest.mark.parametrize("kind", ["1x16", "16x16", "rht"])
def test_nvfp4_copies_match_the_reference(kind, shape):
    x = source(shape, torch.float32, seed=2)
    tile, rht = kind == "16x16", kind == "rht"
    q = te.NVFP4Quantizer(with_2d_quantization=tile, with_rht=rht)
    t = q(x)
    m, k = rows(x).shape
    assert type(t) is te.NVFP4Tensor and t._columnwise_rht == rht
    assert t._rowwise_data.dtype == torch.uint8 and t._rowwise_data.shape == (*x.shape[:-1], k // 2)
    assert t._columnwise_data.shape == (k, m // 2)
    x2 = rows(x)
    amax_col = rht16(x2.T).abs().amax() if rht else x2.abs().amax()
    assert torch.equal(t._amax, torch.stack((x2.abs().amax(), amax_col)))
    _, row = copy_of(q, x, True)
    tc, col = copy_of(q, x, False)
    assert torch.equal(rows(row), nvfp4_qdq(x2, tile))
    stored = nvfp4_qdq(x2.T, tile, rht)  # [K, M] as stored (transformed domain with rht)
    assert torch.equal(rows(col), (unrht16(stored) if rht else stored).T)
    if tile:
        assert torch.equal(row, col)
    # what te_gemm multiplies: the stored copy as is, rounded to BF16
    op = tc._operand()
    assert op[5] is tc._amax and op[6] is rht


def test_stochastic_rounding_seed_comes_from_torchs_generator():
    """Each stochastically rounded quantization draws its 63-bit seed from torch's default CPU
    generator: replaying the generator and quantizing through te-core with that seed gives the
    same bytes; same manual_seed -> same bytes; another -> other bytes, same scales."""
    x = source((64, 64), seed=3)
    q = te.NVFP4Quantizer(stochastic_rounding=True, with_rht=True)
    torch.manual_seed(11)
    a = q(x)
    torch.manual_seed(11)
    seed = int(torch.randint(2**63 - 1, (1,), dtype=torch.int64).item())
    cfg = _C.QuantConfig(stochastic_rounding=True, rng_seed=seed)
    rd, rs, cd, cs, amax = _kernels.quantize_mx(x, int(_C.ScalingMode.NVFP4_1D), None, True, True, cfg, True)
    assert torch.equal(a._rowwise_data, rd) and torch.equal(a._columnwise_data, cd)
    # scale tables: the valid region (te never writes the padding)
    assert torch.equal(a._rowwise_scale_inv[:64, :4], rs[:64, :4])
    assert torch.equal(a._columnwise_scale_inv[:64, :4], cs[:64, :4]) and torch.equal(a._amax, amax)
    torch.manual_seed(11)
    assert torch.equal(q(x)._rowwise_data, a._rowwise_data)
    torch.manual_seed(12)
    b = q(x)
    assert not torch.equal(b._rowwise_data, a._rowwise_data)
    assert torch.equal(b._rowwise_scale_inv[:64, :4], a._rowwise_scale_inv[:64, :4])
    assert torch.equal(b._amax, a._amax)
    # round to nearest is the other quantizer's
    rn = te.NVFP4Quantizer(with_rht=True)(x)
    assert rel(rn.dequantize(), x) <= rel(a.dequantize(), x)


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_functional_gemms_take_mx_tensors(fmt):
    """te.functional.gemm / gemm_dgrad / gemm_wgrad read the copy each layout needs, exactly the
    BF16-rounded reference values multiplied in float64 (to fp32 rounding)."""
    x, w, dy = source((64, 96), seed=4), source((32, 96), seed=5), source((64, 32), seed=6)
    if fmt == "mxfp8":
        qx, qw, qg = te.MXFP8Quantizer(E4M3), te.MXFP8Quantizer(E4M3), te.MXFP8Quantizer(E5M2)

        def val(t, tr=False):
            return bf16(mxfp8_qdq(t.T if tr else t, E5M2 if t is dy else E4M3))
    else:
        qx, qw, qg = (te.NVFP4Quantizer(with_rht=True), te.NVFP4Quantizer(), te.NVFP4Quantizer(with_rht=True))

        def val(t, tr=False):
            return bf16(nvfp4_qdq(t.T if tr else t, rht=tr and t is not w))

    tx, tw, tg = qx(x), qw(w), qg(dy)
    y = te.functional.gemm(tx, tw)
    assert rel(y, val(x) @ val(w).T) <= 1e-6
    dx = te.functional.gemm_dgrad(tg, tw)
    assert rel(dx, val(dy) @ val(w, True).T) <= 1e-6
    dw = te.functional.gemm_wgrad(tg, tx)
    assert rel(dw, val(dy, True) @ val(x, True).T) <= 1e-6
    assert rel(y, x @ w.T) < 0.25
    with pytest.raises(ValueError, match="te_gemm does not mix MXFP8 or NVFP4 operands"):
        other = te.NVFP4Quantizer() if fmt == "mxfp8" else te.MXFP8Quantizer(E4M3)
        te.functional.gemm(tx, other(w))
    if fmt == "nvfp4":  # the transform on one wgrad operand only
        with pytest.raises(ValueError, match="carries the Hadamard transform"):
            te.functional.gemm_wgrad(tg, te.NVFP4Quantizer()(x))


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_tensor_ops_usage_and_save_load(fmt):
    x = source((64, 64), torch.bfloat16, seed=7)
    q = te.MXFP8Quantizer(E4M3) if fmt == "mxfp8" else te.NVFP4Quantizer(with_2d_quantization=True)
    t = q(x)
    ref = t.dequantize()
    assert ref.dtype == torch.bfloat16 and not torch.equal(ref, x)
    # ops te does not implement run on the dequantized values and return plain tensors
    for got, want in ((t + 1, ref + 1), (t.t(), ref.t()), (t[3:5], ref[3:5])):
        assert type(got) is torch.Tensor and torch.equal(got, want)
    d, c = t.detach(), t.clone()
    assert type(d) is type(t) and torch.equal(d.dequantize(), ref)
    assert c._rowwise_data.data_ptr() != t._rowwise_data.data_ptr() and torch.equal(c.dequantize(), ref)
    # copy_: same format copies bytes; a plain tensor is quantized in place
    y = source((64, 64), torch.bfloat16, seed=8)
    ptr = c._rowwise_data.data_ptr()
    c.copy_(y)
    assert c._rowwise_data.data_ptr() == ptr and torch.equal(c.dequantize(), q(y).dequantize())
    c.copy_(t)
    assert torch.equal(c.dequantize(), ref)
    c.quantize_(y.float())
    assert torch.equal(c.dequantize(), q(y).dequantize())
    # usage: drop a copy; a missing one cannot be made from the other
    t.update_usage(columnwise_usage=False)
    assert t._columnwise_data is None and torch.equal(t.dequantize(), ref)
    with pytest.raises(
        RuntimeError, match="the columnwise copy is missing .* quantize again with columnwise=True"
    ):
        t.update_usage(columnwise_usage=True)
    with pytest.raises(ValueError, match="cannot both be False"):
        t.update_usage(rowwise_usage=False, columnwise_usage=False)
    # save / load (weights_only), and repr
    buf = io.BytesIO()
    torch.save({"t": c}, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=True)["t"]
    assert type(back) is type(c) and all(
        torch.equal(a, b) for a, b in zip(back._parts(), c._parts(), strict=True)
    )
    assert torch.equal(back.dequantize(), c.dequantize())
    assert repr(t).startswith(f"{type(t).__name__}(shape=(64, 64), dtype=torch.bfloat16")


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="fp8_dtype: expected torch.float8_e4m3fn or torch.float8_e5m2"):
        te.MXFP8Quantizer(torch.float16)
    with pytest.raises(TypeError, match=r"MXFP8Quantizer: with_2d_quantization: expected a bool, got 1"):
        te.MXFP8Quantizer(E4M3, with_2d_quantization=1)
    with pytest.raises(ValueError, match="NVFP4Quantizer: fp4_dtype: expected None"):
        te.NVFP4Quantizer(E4M3)
    with pytest.raises(ValueError, match="with_rht and with_2d_quantization: expected at most one"):
        te.NVFP4Quantizer(with_rht=True, with_2d_quantization=True)
    with pytest.raises(NotImplementedError, match="with_amax_reduction is not supported yet"):
        te.NVFP4Quantizer(with_amax_reduction=True)
    with pytest.raises(NotImplementedError, match="with_post_rht_amax=False is not implemented"):
        te.NVFP4Quantizer(with_rht=True, with_post_rht_amax=False)
    with pytest.raises(NotImplementedError, match="with_random_sign_mask=False is not implemented"):
        te.NVFP4Quantizer(with_random_sign_mask=False)
    with pytest.raises(TypeError, match="MXFP8Quantizer: tensor: expected float32, bfloat16 or float16"):
        te.MXFP8Quantizer(E4M3)(torch.ones(32, 32, dtype=torch.float64))
    with pytest.raises(TypeError, match="NVFP4Quantizer: tensor: expected a torch.Tensor, got list"):
        te.NVFP4Quantizer()([1.0, 2.0])
    # te-core's own checks come back as ValueError naming the argument
    with pytest.raises(ValueError, match="K .* must be even"):
        te.NVFP4Quantizer()(torch.ones(4, 7))
    with pytest.raises(
        ValueError, match="NVFP4Quantizer: tensor: expected at least 1 dim, .*got a 0-dim tensor"
    ):
        te.NVFP4Quantizer()(torch.tensor(1.0))  # was an IndexError
    with pytest.raises(
        ValueError, match=r"src: expected a tensor of dst's shape \[32, 32\] .*got shape \[16, 32\]"
    ):
        te.MXFP8Quantizer(E4M3).update_quantized(
            torch.ones(16, 32), te.MXFP8Quantizer(E4M3)(torch.ones(32, 32))
        )
    with pytest.raises(ValueError, match="M .* must be a multiple of 16"):
        te.NVFP4Quantizer(with_rht=True)(torch.ones(8, 32))
    with pytest.raises(TypeError, match="dst: expected a NVFP4Tensor, got MXFP8Tensor"):
        te.NVFP4Quantizer().update_quantized(torch.ones(32, 32), te.MXFP8Quantizer(E4M3)(torch.ones(32, 32)))
    assert {"MXFP8Quantizer", "NVFP4Quantizer", "MXFP8Tensor", "NVFP4Tensor"} <= set(te.__all__)


def test_torch_compile_says_mx_is_eager_only():
    torch._dynamo.reset()
    m = te.Linear(64, 64, device="cpu")

    def step(x):
        with te.autocast(recipe=te.recipe.MXFP8BlockScaling()):
            return m(x)

    with pytest.raises(NotImplementedError, match="MXFP8 / NVFP4 under torch.compile .* is not implemented"):
        torch.compile(step, backend="eager")(torch.randn(32, 64))
