"""te_jax's GEMM with gelu fused into a delayed-scaled FP8 output (te_gemm_act_ffi: te_gemm's
GELU_AUX / DGELU with an FP8 D, te/gemm.h) on the CPU backend.

te/gemm.h defines the fused forms as exactly the GEMM followed by te's activation pass, so the
reference is those two calls through te_jax (gemm, then the activation forward / backward with
the same delayed output): every part must match bit for bit. Independently, the pre-activation
is checked against the float64 product of the dequantized operands (normwise <= 1e-5 fp32,
1e-2 bf16) and the dequantized output against float64 gelu / gelu' of it (<= 0.07: one E4M3 /
E5M2 rounding).

Run: PYTHONPATH=packages/te-core/src:packages/te-jax/src pytest tests/jax/test_gemm_gelu.py
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import te_jax
from te_core import _ops
from te_jax import _ffi
from te_jax._activation import act_bwd, act_fwd
from te_jax._fused import Fp8Out
from te_jax._gemm import gemm_gelu_fp8

E4M3, E5M2 = jnp.float8_e4m3fn, jnp.float8_e5m2
F32, BF16 = jnp.float32, jnp.bfloat16
GELU = _ops.ACTIVATIONS["gelu"]
PARTS = ("data", "scale_inv", "columnwise_data", "columnwise_scale_inv", "amax")


def _randn(shape, dtype=F32, seed=0, scale=1.0):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * np.float32(scale)
    return jnp.asarray(x, dtype)


def _f64(a) -> np.ndarray:
    return np.asarray(jnp.asarray(a).astype(F32)).astype(np.float64)


def _rel(actual, expected) -> float:
    actual, expected = _f64(actual), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


def _bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view(np.uint8) if a.dtype.itemsize == 1 else a.view(f"u{a.dtype.itemsize}")


def _same_parts(d, ref):
    for part in PARTS:
        a, b = getattr(d, part), getattr(ref, part)
        assert (a is None) == (b is None), part
        if a is not None:
            assert a.shape == b.shape and a.dtype == b.dtype, part
            np.testing.assert_array_equal(_bits(a), _bits(b), err_msg=part)


def _gelu64(v):
    return 0.5 * v * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3)))


def _dgelu64(v):
    c = math.sqrt(2.0 / math.pi)
    t = np.tanh(c * (v + 0.044715 * v**3))
    return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * v**2)


def _dequant(q, columnwise=False) -> np.ndarray:
    if columnwise:
        return _f64(q.columnwise_data).T * float(q.columnwise_scale_inv[0])
    return _f64(q.data) * float(q.scale_inv[0])


def _scale(v):
    return jnp.full((1,), v, F32)


# (M, N, K): FP8-aligned, and awkward (odd rows, N not a multiple of 16)
SHAPES = [(48, 80, 64), (37, 24, 32)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("aux", [F32, BF16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("bias", [None, "aux", "fp32"])
@pytest.mark.parametrize("trans_b", [True, False], ids=["w_nk", "w_kn"])
@pytest.mark.parametrize("columnwise", [True, False], ids=["both", "rowwise"])
def test_gelu_aux(shape, aux, bias, trans_b, columnwise):
    """FC1: pre = x w (+ bias) rounded to aux's dtype; D = gelu(pre), delayed-scaled E4M3."""
    m, n, k = shape
    x = _randn((m, k), aux, seed=1)
    w = _randn((n, k) if trans_b else (k, n), aux, seed=2, scale=0.2)
    b = None if bias is None else _randn((n,), aux if bias == "aux" else F32, seed=3, scale=0.3)
    qx = te_jax.quantize(x, scale=_scale(4.0))
    qw = te_jax.quantize(w, scale=_scale(16.0), columnwise=not trans_b)
    fp8 = Fp8Out(E4M3, columnwise=columnwise, delayed=True)
    s = _scale(8.0)
    d, pre, dbias = gemm_gelu_fp8(qx, qw, fp8, s, bias=b, aux_dtype=aux, trans_b=trans_b)
    assert dbias is None and pre.shape == (m, n) and pre.dtype == aux
    ref_pre = te_jax.gemm(qx, qw, bias=b, out_dtype=aux, trans_b=trans_b)
    np.testing.assert_array_equal(_bits(pre), _bits(ref_pre))
    _same_parts(d, act_fwd(ref_pre, GELU, fp8=fp8, scale=s))
    # independently: the product of the dequantized operands, and gelu of pre
    wk = _dequant(qw, columnwise=not trans_b)
    prod = _dequant(qx) @ (wk.T if trans_b else wk) + (0.0 if b is None else _f64(b))
    assert _rel(pre, prod) <= (1e-5 if aux == F32 else 1e-2)
    assert _rel(_dequant(d), _gelu64(_f64(pre))) <= 0.07
    if columnwise:
        np.testing.assert_array_equal(_dequant(d, columnwise=True), _dequant(d))
    assert float(d.amax[0]) == pytest.approx(float(np.max(np.abs(_gelu64(_f64(pre))))), rel=1e-5)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("aux", [F32, BF16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("grad", [E5M2, E4M3], ids=["e5m2", "e4m3"])
@pytest.mark.parametrize("bias_grad", [True, False], ids=["dbias", "no_dbias"])
def test_dgelu(shape, aux, grad, bias_grad):
    """FC2's dgrad: g = dy w rounded to pre's dtype; D = g gelu'(pre), delayed-scaled, with dbias."""
    m, n, k = shape
    dy = _randn((m, k), aux, seed=4)
    w = _randn((n, k), aux, seed=5, scale=0.2)  # FC2's kernel [F, H] = [N, K]: dx = dy w^T
    pre = _randn((m, n), aux, seed=6, scale=1.5)
    qdy = te_jax.quantize(dy, dtype=grad, scale=_scale(2.0))
    qw = te_jax.quantize(w, scale=_scale(16.0))
    fp8 = Fp8Out(grad, columnwise=True, delayed=True)
    s = _scale(32.0)
    d, none, dbias = gemm_gelu_fp8(qdy, qw, fp8, s, gelu_input=pre, bias_grad=bias_grad)
    assert none is None
    g = te_jax.gemm(qdy, qw, out_dtype=aux)
    ref, ref_dbias = act_bwd(g, pre, GELU, fp8=fp8, dbias=bias_grad, scale=s)
    _same_parts(d, ref)
    if bias_grad:
        assert dbias.shape == (n,) and dbias.dtype == aux
        np.testing.assert_array_equal(_bits(dbias), _bits(ref_dbias))
        assert _rel(dbias, np.sum(_f64(g) * _dgelu64(_f64(pre)), axis=0)) <= 1e-2
    else:
        assert dbias is None
    prod = _dequant(qdy) @ _dequant(qw).T
    assert _rel(g, prod) <= (1e-5 if aux == F32 else 1e-2)
    assert _rel(_dequant(d), _f64(g) * _dgelu64(_f64(pre))) <= 0.07


def test_under_jit_and_leading_dims_of_gelu_input():
    x, w = _randn((32, 48), BF16, seed=7), _randn((64, 48), BF16, seed=8, scale=0.2)
    qx, qw = te_jax.quantize(x), te_jax.quantize(w)
    fp8 = Fp8Out(E4M3, columnwise=True, delayed=True)

    def f(qx, qw, s):
        return gemm_gelu_fp8(qx, qw, fp8, s)

    d, pre, _ = jax.jit(f)(qx, qw, _scale(2.0))
    d2, pre2, _ = f(qx, qw, _scale(2.0))
    np.testing.assert_array_equal(_bits(pre), _bits(pre2))
    _same_parts(d, d2)
    # DGELU's saved pre may keep the activation's leading dims
    qdy = te_jax.quantize(_randn((32, 64), BF16, seed=9), dtype=E5M2)
    qw2 = te_jax.quantize(_randn((64, 48), BF16, seed=10), columnwise=True)
    fp8g = Fp8Out(E5M2, delayed=True)
    a, _, _ = gemm_gelu_fp8(qdy, qw2, fp8g, _scale(1.0), gelu_input=_randn((2, 16, 48), BF16), trans_b=False)
    b, _, _ = gemm_gelu_fp8(qdy, qw2, fp8g, _scale(1.0), gelu_input=_randn((32, 48), BF16), trans_b=False)
    _same_parts(a, b)


def test_errors():
    x, w = _randn((32, 48)), _randn((64, 48))
    qx, qw = te_jax.quantize(x), te_jax.quantize(w)
    fp8 = Fp8Out(E4M3, delayed=True)
    s = _scale(1.0)
    with pytest.raises(TypeError, match="x: expected a per-tensor FP8 ScaledTensor"):
        gemm_gelu_fp8(x, qw, fp8, s)
    bx = te_jax.quantize(_randn((32, 128)), scaling_mode="block_1d")
    bw = te_jax.quantize(_randn((64, 128)), scaling_mode="block_2d")
    with pytest.raises(TypeError, match="x: expected a per-tensor FP8 ScaledTensor"):
        gemm_gelu_fp8(bx, bw, fp8, s)
    with pytest.raises(ValueError, match="fp8: expected a delayed per-tensor output"):
        gemm_gelu_fp8(qx, qw, Fp8Out(E4M3), s)
    with pytest.raises(ValueError, match="bias_grad: expected False without gelu_input"):
        gemm_gelu_fp8(qx, qw, fp8, s, bias_grad=True)
    pre = _randn((32, 64))
    with pytest.raises(ValueError, match="bias: expected None with gelu_input"):
        gemm_gelu_fp8(qx, qw, fp8, s, gelu_input=pre, bias=_randn((64,)))
    # te_gemm's own checks come back through the handler
    with pytest.raises(Exception, match=r"config->aux\.shape: expected \[32, 64\]"):
        gemm_gelu_fp8(qx, qw, fp8, s, gelu_input=_randn((32, 63)))
    with pytest.raises(Exception, match="config->bias.shape"):
        gemm_gelu_fp8(qx, qw, fp8, s, bias=_randn((63,)))


def _raw_call(aliases, epilogue=2):
    """The handler called as te_jax does, but with ``aliases`` and ``epilogue`` as given."""
    qx, qw = te_jax.quantize(_randn((16, 32))), te_jax.quantize(_randn((16, 32)))
    specs = _ops.fused_output(
        (16, 16), _ops.FP8_DTYPES[0], _ops.SCALING_MODES["per_tensor"], True, False, True
    )
    specs = (*specs[:5], _ops.TensorSpec(_ops.ABSENT_SHAPE, _ops.FLOAT32))
    mn = _ops.TensorSpec((16, 16), _ops.FLOAT32)
    absent = _ops.TensorSpec(_ops.ABSENT_SHAPE, _ops.FLOAT32)
    z = jnp.zeros(_ops.ABSENT_SHAPE, F32)
    return _ffi.call(
        _ffi.GEMM_ACT,
        (*specs, mn, absent, absent),
        qx.data,
        qx.scale_inv,
        qw.data,
        qw.scale_inv,
        z,
        z,
        _scale(1.0),
        jnp.zeros((1,), F32),
        aliases=aliases,
        a_columnwise=np.bool_(False),
        b_columnwise=np.bool_(False),
        trans_a=np.bool_(False),
        trans_b=np.bool_(True),
        epilogue=np.int32(epilogue),
        has_bias=np.bool_(False),
        has_bias_grad=np.bool_(False),
        use_split_accumulator=np.int32(-1),
        columnwise=np.bool_(False),
    )


def test_handler_errors():
    assert float(_raw_call({7: 4})[4][0]) > 0  # as te_jax calls it: this call's amax
    with pytest.raises(Exception, match="amax_in: expected fp32 \\[1\\] aliased to result 4"):
        _raw_call(None)
    with pytest.raises(Exception, match="epilogue: expected GELU_AUX \\(2\\) or DGELU \\(3\\)"):
        _raw_call({7: 4}, epilogue=1)
