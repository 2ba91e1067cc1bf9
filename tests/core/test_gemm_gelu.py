"""te_gemm's GELU_AUX and DGELU epilogues with a per-tensor FP8 output (an MLP's FC1 writing FC2's
quantized input; FC2's dgrad writing FC1's quantized gradient and its bias gradient) on the CPU
backend. The contract (te/gemm.h): the product is rounded to aux's dtype, and D is exactly
te_activation_fwd(aux) / te_activation_bwd(product, aux) under delayed scaling. Checked three
ways: the product against the float64 one of the operands (NUMERICS.md's normwise tolerances),
D's parts bit for bit against te_quantize of te's own fp32 activation and against the oracle's
quantization of it (_fused.check_quantized), and te's activation against the float64 formula."""

from __future__ import annotations

import re

import _oracle as O
import ml_dtypes
import numpy as np
import pytest
from _buffers import DATA_SENTINEL, FP8_DTYPE, Quantized, f32, fp8_buffer, rng_for, tensor
from _fused import assert_matches_ref, check_quantized, hp_output
from te_core import _C

M, E, A = _C.ScalingMode, _C.Epilogue, _C.Activation
BF16 = ml_dtypes.bfloat16
AUX_TYPES = [np.float32, np.float16, BF16]
TOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float16): 1e-3, np.dtype(BF16): 1e-2}
# (M, N, K): odd sizes, one element, more than one 128-block of K, and empty dims.
SHAPES = [(7, 13, 5), (1, 1, 1), (129, 67, 300), (0, 5, 3), (4, 0, 3), (4, 5, 0)]
# check_quantized's cases: the row-wise copy alone, and both copies (FC2's fprop and wgrad).
CASES = {"delayed": (True, False, 0.25, 3.0), "delayed_ct": (True, True, 0.0, 0.5)}


def dtype_id(t):
    return np.dtype(t).name


def gelu64(x):
    x = np.asarray(x, np.float64)
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def dgelu64(x):
    x = np.asarray(x, np.float64)
    c = np.sqrt(2.0 / np.pi)
    t = np.tanh(c * (x + 0.044715 * x**3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * x * x)


def assert_product(got, x64, w64, alpha, b64, dtype, what):
    """got = alpha x w^T (+ b), rounded to its dtype: normwise, relative to the terms' magnitudes
    (the bias may cancel the product)."""
    want = alpha * (x64 @ w64.T) + b64
    scale = np.linalg.norm(alpha * (np.abs(x64) @ np.abs(w64).T) + np.abs(b64))
    err = np.linalg.norm(got.astype(np.float64) - want)
    assert err <= TOL[np.dtype(dtype)] * max(scale, 1e-30), (
        f"{what}: normwise error {err / max(scale, 1e-30):.3g}"
    )


def operands(rng, m, n, k, fp8: bool):
    """x [M, K] and w [N, K] (FC1's fprop: y = x w^T) as te_gemm descriptors, and their values as
    the GEMM reads them in float64."""
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((n, k)) / np.sqrt(max(k, 1))).astype(np.float32)
    if not fp8:
        xb, wb = x.astype(BF16), w.astype(BF16)

        def hp(a):
            return _C.QuantizedTensor(int(M.PER_TENSOR), rowwise_data=tensor(a))

        return hp(xb), hp(wb), xb.astype(np.float64), wb.astype(np.float64)
    cfg = _C.QuantConfig(compute_scale=True)
    qx = Quantized(int(M.PER_TENSOR), x.shape, O.E4M3, True, False, amax=0.0, scale=1.0).quantize(x, cfg)
    qw = Quantized(int(M.PER_TENSOR), w.shape, O.E4M3, True, False, amax=0.0, scale=1.0).quantize(w, cfg)

    def value(q, shape):
        return O.from_fp8(q.rowwise, O.E4M3).reshape(shape).astype(np.float64) * float(q.rowwise_scale_inv[0])

    return qx.descriptor(), qw.descriptor(), value(qx, x.shape), value(qw, w.shape)


def fused_output(case: str, shape, fmt: str) -> Quantized:
    row, col, amax, scale = CASES[case]
    return Quantized(int(M.PER_TENSOR), shape, fmt, rowwise=row, columnwise=col, amax=amax, scale=scale)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("fmt", [O.E4M3, O.E5M2])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("aux_dtype", AUX_TYPES, ids=dtype_id)
@pytest.mark.parametrize("fp8_operands", [True, False], ids=["fp8", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_gelu_fp8_output(shape, fp8_operands, aux_dtype, with_bias, fmt, case):
    m, n, k = shape
    rng = rng_for("gemm_gelu", str(shape), fp8_operands, dtype_id(aux_dtype), with_bias, fmt, case)
    a, b, x64, w64 = operands(rng, m, n, k, fp8_operands)
    alpha = np.float32(0.75)
    # a bias in aux's dtype (or fp32 beside 16-bit aux, also allowed)
    bias_dtype = np.float32 if aux_dtype is np.float16 else aux_dtype
    bias = rng.standard_normal(n).astype(np.float32).astype(bias_dtype)
    aux = np.full((m, n), np.nan, np.float32).astype(aux_dtype)
    q = fused_output(case, (m, n), fmt)
    config = _C.GemmConfig(
        trans_b=True,
        alpha=float(alpha),
        epilogue=E.GELU_AUX,
        aux=tensor(aux),
        bias=tensor(bias) if with_bias else None,
    )
    _C.gemm(a, b, q.descriptor(), config)

    b64 = bias.astype(np.float64) if with_bias else np.zeros(n)
    assert_product(aux, x64, w64, float(alpha), b64, aux_dtype, "aux")

    # D: te_activation_fwd of the stored aux, quantized; te's gelu against the float64 formula.
    y32 = np.zeros((m, n), np.float32)
    _C.activation_fwd(tensor(aux), hp_output(y32), int(A.GELU))
    assert_matches_ref(y32, gelu64(aux), "gelu(aux)", rtol=1e-5)
    check_quantized(q, case, y32, fmt, f"gemm gelu {case}")


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("fmt", [O.E4M3, O.E5M2])
@pytest.mark.parametrize(
    "dbias_dtype", [None, np.float32, BF16], ids=["no_dbias", "dbias_fp32", "dbias_bf16"]
)
@pytest.mark.parametrize("aux_dtype", AUX_TYPES, ids=dtype_id)
@pytest.mark.parametrize("fp8_operands", [True, False], ids=["fp8", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_dgelu_fp8_output(shape, fp8_operands, aux_dtype, dbias_dtype, fmt, case):
    m, n, k = shape
    rng = rng_for("gemm_dgelu", str(shape), fp8_operands, dtype_id(aux_dtype), str(dbias_dtype), fmt, case)
    a, b, x64, w64 = operands(rng, m, n, k, fp8_operands)
    alpha = np.float32(1.25)
    aux = (rng.standard_normal((m, n)) * 2).astype(np.float32).astype(aux_dtype)  # the saved h
    dbias = None if dbias_dtype is None else np.full(n, np.nan, np.float32).astype(dbias_dtype)
    q = fused_output(case, (m, n), fmt)
    config = _C.GemmConfig(
        trans_b=True,
        alpha=float(alpha),
        epilogue=E.DGELU,
        aux=tensor(aux),
        bias_grad=None if dbias is None else tensor(dbias),
    )
    _C.gemm(a, b, q.descriptor(), config)

    # The product rounded to aux's dtype (te_gemm's plain output), then te's fp32 dgelu of it.
    g = np.full((m, n), np.nan, np.float32).astype(aux_dtype)
    _C.gemm(a, b, hp_output(g), _C.GemmConfig(trans_b=True, alpha=float(alpha)))
    assert_product(g, x64, w64, float(alpha), np.zeros(n), aux_dtype, "product")
    dx32, db32 = np.zeros((m, n), np.float32), f32(0, (n,))
    _C.activation_bwd(tensor(g), tensor(aux), hp_output(dx32), tensor(db32), int(A.GELU))
    assert_matches_ref(dx32, g.astype(np.float64) * dgelu64(aux), "dgelu(aux) * g", rtol=1e-5)
    check_quantized(q, case, dx32, fmt, f"gemm dgelu {case}")
    if dbias is not None:
        np.testing.assert_array_equal(dbias, db32.astype(dbias_dtype))
        sums = dx32.astype(np.float64).sum(axis=0)
        scale = np.abs(dx32).astype(np.float64).sum(axis=0).max(initial=0.0)
        assert np.abs(db32 - sums).max(initial=0.0) <= 1e-5 * max(scale, 1e-30)


def bits_of(q: Quantized, part: str) -> np.ndarray:
    return getattr(q, part).view(np.uint8)


@pytest.mark.parametrize("aux_dtype", [np.float32, BF16], ids=dtype_id)
def test_dgelu_product_buffer_changes_no_result(aux_dtype):
    """config->dgelu_product (a caller's buffer for the product between the two passes) leaves
    every result bit for bit as without it."""
    rng = rng_for("gemm_dgelu_product", dtype_id(aux_dtype))
    m, n, k = 37, 48, 130
    a, b, _, _ = operands(rng, m, n, k, True)
    aux = (rng.standard_normal((m, n)) * 2).astype(np.float32).astype(aux_dtype)
    got = []
    for product in (None, np.full((m, n), np.nan, np.float32).astype(aux_dtype)):
        q, db = fused_output("delayed_ct", (m, n), O.E5M2), f32(np.nan, (n,))
        config = _C.GemmConfig(
            trans_b=True,
            epilogue=E.DGELU,
            aux=tensor(aux),
            bias_grad=tensor(db),
            dgelu_product=None if product is None else tensor(product),
        )
        _C.gemm(a, b, q.descriptor(), config)
        got.append((q, db))
    (q1, db1), (q2, db2) = got
    for part in ("rowwise", "columnwise", "rowwise_scale_inv", "columnwise_scale_inv", "amax"):
        assert np.array_equal(bits_of(q1, part), bits_of(q2, part)), part
    assert np.array_equal(db1.view(np.uint32), db2.view(np.uint32))


def test_same_bytes_as_gemm_then_activation():
    """The fused call and the two calls it stands for (te_gemm with BIAS into aux, then
    te_activation_fwd with FP8 output) leave every buffer bit for bit the same."""
    rng = rng_for("gemm_gelu_two_calls")
    m, n, k = 33, 70, 129
    a, b, _, _ = operands(rng, m, n, k, True)
    bias = rng.standard_normal(n).astype(np.float32).astype(BF16)
    aux1, aux2 = np.zeros((m, n), BF16), np.zeros((m, n), BF16)
    q1, q2 = fused_output("delayed_ct", (m, n), O.E4M3), fused_output("delayed_ct", (m, n), O.E4M3)
    _C.gemm(
        a,
        b,
        q1.descriptor(),
        _C.GemmConfig(trans_b=True, epilogue=E.GELU_AUX, aux=tensor(aux1), bias=tensor(bias)),
    )
    d2 = _C.QuantizedTensor(int(M.PER_TENSOR), rowwise_data=tensor(aux2))
    _C.gemm(a, b, d2, _C.GemmConfig(trans_b=True, epilogue=E.BIAS, bias=tensor(bias)))
    _C.activation_fwd(tensor(aux2), q2.descriptor(), int(A.GELU), _C.QuantConfig())
    assert np.array_equal(aux1.view(np.uint16), aux2.view(np.uint16))
    for part in ("rowwise", "columnwise", "rowwise_scale_inv", "columnwise_scale_inv", "amax"):
        assert np.array_equal(bits_of(q1, part), bits_of(q2, part)), part


# ---- errors -------------------------------------------------------------------------------------


def raises(text, a, b, d, **config):
    with pytest.raises(ValueError, match=re.escape(text)):
        _C.gemm(a, b, d, _C.GemmConfig(trans_b=True, **config))


def test_errors():
    rng = rng_for("gemm_gelu_errors")
    a, b, _, _ = operands(rng, 8, 4, 16, True)
    q = fused_output("delayed_ct", (8, 4), O.E4M3)
    aux = np.zeros((8, 4), BF16)
    # aux is required, and high precision
    raises(
        "config->aux: epilogue GELU_AUX needs the [8, 4] aux (written",
        a,
        b,
        q.descriptor(),
        epilogue=E.GELU_AUX,
    )
    raises(
        "config->aux.dtype: expected float32, float16, bfloat16, got float8_e4m3",
        a,
        b,
        q.descriptor(),
        epilogue=E.GELU_AUX,
        aux=tensor(fp8_buffer((8, 4)), FP8_DTYPE[O.E4M3]),
    )
    # the bias in aux's dtype or fp32
    raises(
        "config->bias.dtype: expected bfloat16, float32, got float16",
        a,
        b,
        q.descriptor(),
        epilogue=E.GELU_AUX,
        aux=tensor(aux),
        bias=tensor(np.zeros(4, np.float16)),
    )
    # a column-wise copy only with GELU_AUX or DGELU
    raises(
        "d->columnwise_data: expected NULL (te_gemm writes a column-wise copy only with epilogue GELU_AUX or DGELU",
        a,
        b,
        q.descriptor(),
    )
    # DGELU's bias gradient: [N], and only with an FP8 output
    raises(
        "config->bias_grad.shape: expected [4] ([N]: the pre-activation's bias gradient",
        a,
        b,
        fused_output("delayed", (8, 4), O.E4M3).descriptor(),
        epilogue=E.DGELU,
        aux=tensor(aux),
        bias_grad=tensor(np.zeros(8, np.float32)),
    )
    raises(
        "config->bias_grad: expected NULL with epilogue DGELU (bias_grad is written by BGRAD, and "
        "by DGELU with an FP8 output)",
        a,
        b,
        _C.QuantizedTensor(int(M.PER_TENSOR), rowwise_data=tensor(np.zeros((8, 4), BF16))),
        epilogue=E.DGELU,
        aux=tensor(aux),
        bias_grad=tensor(np.zeros(4, np.float32)),
    )
    # dgelu_product: only with DGELU and an FP8 output; aux's dtype and shape; no overlap
    raises(
        "config->dgelu_product: expected NULL except with epilogue DGELU and an FP8 output",
        a,
        b,
        q.descriptor(),
        epilogue=E.GELU_AUX,
        aux=tensor(aux),
        dgelu_product=tensor(np.zeros((8, 4), BF16)),
    )
    raises(
        "config->dgelu_product.dtype: expected bfloat16",
        a,
        b,
        q.descriptor(),
        epilogue=E.DGELU,
        aux=tensor(aux),
        dgelu_product=tensor(np.zeros((8, 4), np.float32)),
    )
    raises(
        "config->dgelu_product.shape: expected [8, 4]",
        a,
        b,
        q.descriptor(),
        epilogue=E.DGELU,
        aux=tensor(aux),
        dgelu_product=tensor(np.zeros((4, 8), BF16)),
    )
    raises(
        "overlap",
        a,
        b,
        q.descriptor(),
        epilogue=E.DGELU,
        aux=tensor(aux),
        dgelu_product=tensor(aux),
    )
    # the output's parts as te_activation_fwd plans them: a copy's scale_inv is required
    no_sinv = _C.QuantizedTensor(
        int(M.PER_TENSOR),
        rowwise_data=tensor(q.rowwise, FP8_DTYPE[O.E4M3]),
        scale=tensor(f32(1.0)),
    )
    raises("d->rowwise_scale_inv", a, b, no_sinv, epilogue=E.GELU_AUX, aux=tensor(aux))
    # aux is written, then read while D is written: no overlap with D's copies
    shared = np.zeros(64, np.uint8)
    over = _C.QuantizedTensor(
        int(M.PER_TENSOR),
        rowwise_data=tensor(q.rowwise, FP8_DTYPE[O.E4M3]),
        rowwise_scale_inv=tensor(q.rowwise_scale_inv),
        columnwise_data=tensor(shared, FP8_DTYPE[O.E4M3], shape=[4, 8]),
        columnwise_scale_inv=tensor(q.columnwise_scale_inv),
        scale=tensor(f32(1.0)),
    )
    raises(
        "overlap", a, b, over, epilogue=E.GELU_AUX, aux=tensor(shared, int(_C.DType.BFLOAT16), shape=[8, 4])
    )
    assert (q.rowwise == DATA_SENTINEL).all() and (q.columnwise == DATA_SENTINEL).all()
