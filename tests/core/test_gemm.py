"""te_gemm on the CPU backend against an independent numpy oracle: the float64 product of the
operands as te's GEMM must read them (high precision as given; FP8 dequantized from the copy the
layout needs, q * scale_inv in fp32, block scales expanded by _oracle from te/tensor.h's table),
then alpha, beta, the epilogue and the output conversion. Tolerances are NUMERICS.md's "How to test
numerics": normwise relative error <= 1e-5 with fp32 output, <= 1e-2 with bf16 output, and <= 0.1
against the unquantized product for E4M3 operands. FP8 operands come from te's own quantize."""

from __future__ import annotations

import re

import _oracle as O
import ml_dtypes
import numpy as np
import pytest
from _buffers import DATA_SENTINEL, FP8_DTYPE, SOURCE_TYPES, Quantized, f32, fp8_buffer, rng_for, tensor
from te_core import _C

D, M, P, E = _C.DType, _C.ScalingMode, _C.Part, _C.Epilogue
BF16 = ml_dtypes.bfloat16
MODE = {0: int(M.PER_TENSOR), 1: int(M.BLOCK_1D), 2: int(M.BLOCK_2D)}
TOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float16): 1e-3, np.dtype(BF16): 1e-2}
# (M, N, K): non-multiples of 16, a single element, more than one 128-block, and empty dims.
SHAPES = [(7, 13, 5), (1, 1, 1), (129, 257, 65), (32, 16, 48), (0, 5, 3), (4, 0, 3), (4, 5, 0)]
LAYOUTS = [(False, False), (False, True), (True, False), (True, True)]
# FP8 layouts by the Linear layer that uses them (te/gemm.h): fprop x w^T, dgrad dy w, wgrad dy^T x.
LAYOUT_IDS = ["NN_dgrad", "NT_fprop", "TN_wgrad", "TT"]


def dtype_id(t):
    return np.dtype(t).name


# ---- buffers and the oracle -------------------------------------------------------------------


def hp(arr: np.ndarray) -> _C.QuantizedTensor:
    """A high-precision operand or output: its row-wise data alone."""
    return _C.QuantizedTensor(int(M.PER_TENSOR), rowwise_data=tensor(arr))


def source_shape(mn: int, k: int, trans: bool, is_b: bool) -> tuple[int, int]:
    """The stored shape of an operand: A [M, K] (trans: [K, M]); B [K, N] (trans: [N, K])."""
    if is_b:
        return (mn, k) if trans else (k, mn)
    return (k, mn) if trans else (mn, k)


def random_matrix(rng, shape, dtype=np.float32, spread=0.0) -> np.ndarray:
    """Normal values; with spread, rows and columns get magnitudes 2^[-spread, spread] so that
    blocks of one tensor have very different scales."""
    x = rng.standard_normal(shape)
    if spread and x.size:
        x = x * np.exp2(rng.uniform(-spread, spread, (shape[0], 1)))
        x = x * np.exp2(rng.uniform(-spread, spread, (1, shape[1])))
    return np.ascontiguousarray(x.astype(np.float32).astype(dtype))


def quantize(x: np.ndarray, mode_dim: int, fmt: str, rowwise=True, columnwise=True) -> Quantized:
    """te's own quantize (current scaling for per-tensor), both copies by default."""
    if mode_dim == 0:
        q = Quantized(MODE[0], x.shape, fmt, rowwise, columnwise, amax=0.0, scale=1.0)
        return q.quantize(x, _C.QuantConfig(compute_scale=True))
    return Quantized(MODE[mode_dim], x.shape, fmt, rowwise, columnwise).quantize(x)


def dequantized_source(q: Quantized, columnwise: bool) -> np.ndarray:
    """The source [rows, cols] as the GEMM reads it from one copy: float(q) * scale_inv in fp32."""
    rows, cols = O.matrix_dims(q.shape)
    if columnwise:
        vals, sinv = O.from_fp8(q.columnwise, q.fmt).T, q.columnwise_scale_inv
    else:
        vals, sinv = O.from_fp8(q.rowwise, q.fmt).reshape(rows, cols), q.rowwise_scale_inv
    mode_dim = {v: k for k, v in MODE.items()}[q.mode]
    s = sinv[0] if mode_dim == 0 else O.expand_block_scale_inv(mode_dim, sinv, rows, cols, columnwise)
    return (vals * np.asarray(s, np.float32)).astype(np.float64)


def fp8_operand_value(q: Quantized, trans: bool, is_b: bool) -> np.ndarray:
    """op(X) in float64 from the copy te must read: A from its column-wise copy iff trans_a; B from
    its column-wise copy iff not trans_b (K contiguous either way)."""
    columnwise = trans if not is_b else not trans
    src = dequantized_source(q, columnwise)
    return src.T if trans else src


def gelu(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def dgelu(x):
    c = np.sqrt(2.0 / np.pi)
    t = np.tanh(c * (x + 0.044715 * x**3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * x * x)


def assert_close(got, want, tol, what=""):
    """Normwise relative error ||got - want|| / ||want|| <= tol (absolute where want is 0)."""
    got = np.asarray(got).astype(np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert np.isfinite(got).all(), f"{what}: non-finite output"
    err = np.linalg.norm(got - want)
    ref = np.linalg.norm(want)
    assert err <= tol * max(ref, 1e-30), (
        f"{what}: normwise relative error {err / max(ref, 1e-30):.3g} > {tol}"
    )


def run_gemm(a, b, d_arr, **config):
    _C.gemm(a, b, hp(d_arr), _C.GemmConfig(**config))
    return d_arr


# ---- high precision ---------------------------------------------------------------------------


@pytest.mark.parametrize("out_dtype", SOURCE_TYPES, ids=dtype_id)
@pytest.mark.parametrize("dtype", SOURCE_TYPES, ids=dtype_id)
@pytest.mark.parametrize("trans_a,trans_b", LAYOUTS, ids=["NN", "NT", "TN", "TT"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_high_precision(shape, trans_a, trans_b, dtype, out_dtype):
    m, n, k = shape
    rng = rng_for("hp", shape, trans_a, trans_b, dtype_id(dtype), dtype_id(out_dtype))
    a = random_matrix(rng, source_shape(m, k, trans_a, False), dtype)
    b = random_matrix(rng, source_shape(n, k, trans_b, True), dtype)
    d = np.full((m, n), np.nan, np.float32).astype(out_dtype)  # beta = 0 must not read D
    run_gemm(hp(a), hp(b), d, trans_a=trans_a, trans_b=trans_b)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = (a64.T if trans_a else a64) @ (b64.T if trans_b else b64)
    assert_close(d, want, TOL[np.dtype(out_dtype)], "D")


def test_batched_operand_and_output_shapes():
    """[..., K] operands and [..., N] outputs use the matrix view, as every te op does."""
    rng = rng_for("batched")
    x = random_matrix(rng, (6, 5)).reshape(2, 3, 5)
    w = random_matrix(rng, (4, 5))
    d = np.zeros((2, 3, 4), np.float32)
    run_gemm(hp(x), hp(w), d, trans_b=True)
    assert_close(d.reshape(6, 4), x.reshape(6, 5).astype(np.float64) @ w.T.astype(np.float64), 1e-5)


def test_no_config_means_defaults_and_config_is_reusable():
    rng = rng_for("defaults")
    a, b = random_matrix(rng, (3, 4)), random_matrix(rng, (4, 5))
    d = np.zeros((3, 5), np.float32)
    _C.gemm(hp(a), hp(b), hp(d))
    want = a.astype(np.float64) @ b
    assert_close(d, want, 1e-5)
    cfg = _C.GemmConfig(alpha=2.0)
    assert (cfg.trans_a, cfg.trans_b, cfg.beta, cfg.epilogue, cfg.use_split_accumulator) == (0, 0, 0.0, 0, -1)
    for _ in range(2):  # the same config object, twice
        _C.gemm(hp(a), hp(b), hp(d), cfg)
        assert_close(d, 2 * want, 1e-5)
    cfg.alpha = -1.0
    _C.gemm(hp(a), hp(b), hp(d), cfg)
    assert_close(d, -want, 1e-5)


@pytest.mark.parametrize("out_dtype", SOURCE_TYPES, ids=dtype_id)
def test_alpha_beta(out_dtype):
    rng = rng_for("alpha_beta", dtype_id(out_dtype))
    a, b = random_matrix(rng, (9, 20)), random_matrix(rng, (20, 11))
    d0 = random_matrix(rng, (9, 11), out_dtype)
    d = d0.copy()
    run_gemm(hp(a), hp(b), d, alpha=0.5, beta=-2.0)
    want = 0.5 * (a.astype(np.float64) @ b) - 2.0 * d0.astype(np.float64)
    assert_close(d, want, TOL[np.dtype(out_dtype)])


def test_accumulate_really_accumulates():
    """beta = 1 into an fp32 D (a main_grad): two calls add two products to what was there."""
    rng = rng_for("accumulate")
    dy, x = random_matrix(rng, (40, 12)), random_matrix(rng, (40, 9))
    d0 = random_matrix(rng, (12, 9))
    d = d0.copy()
    cfg = _C.GemmConfig(trans_a=True, beta=1.0)  # wgrad dw += dy^T x
    for _ in range(2):
        _C.gemm(hp(dy), hp(x), hp(d), cfg)
    want = d0.astype(np.float64) + 2 * (dy.T.astype(np.float64) @ x)
    assert_close(d, want, 1e-5)
    assert np.abs(d - d0).max() > 1.0  # it moved


def test_k_zero_scales_d_and_runs_the_epilogue():
    d0 = np.arange(12, dtype=np.float32).reshape(3, 4)
    a, b = np.zeros((3, 0), np.float32), np.zeros((0, 4), np.float32)
    d = d0.copy()
    run_gemm(hp(a), hp(b), d, beta=0.5)
    np.testing.assert_array_equal(d, 0.5 * d0)
    bias = np.array([1, 2, 3, 4], np.float32)
    d = d0.copy()
    run_gemm(hp(a), hp(b), d, beta=1.0, epilogue=E.BIAS, bias=tensor(bias))
    np.testing.assert_array_equal(d, d0 + bias)
    bgrad = np.full(3, np.nan, np.float32)
    d = d0.copy()
    run_gemm(hp(a), hp(b), d, epilogue=E.BGRAD, bias_grad=tensor(bgrad))
    np.testing.assert_array_equal(bgrad, 0)
    np.testing.assert_array_equal(d, 0)


# ---- epilogues ----------------------------------------------------------------------------------


@pytest.mark.parametrize("bias_dtype", ["out", "fp32"])
@pytest.mark.parametrize("out_dtype", SOURCE_TYPES, ids=dtype_id)
def test_bias(out_dtype, bias_dtype):
    rng = rng_for("bias", dtype_id(out_dtype), bias_dtype)
    x, w = random_matrix(rng, (10, 24), out_dtype), random_matrix(rng, (7, 24), out_dtype)
    bias = random_matrix(rng, (1, 7), out_dtype if bias_dtype == "out" else np.float32).reshape(7)
    d = np.zeros((10, 7), out_dtype)
    run_gemm(hp(x), hp(w), d, trans_b=True, epilogue=E.BIAS, bias=tensor(bias))
    want = x.astype(np.float64) @ w.T.astype(np.float64) + bias.astype(np.float64)
    assert_close(d, want, TOL[np.dtype(out_dtype)])


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("out_dtype", SOURCE_TYPES, ids=dtype_id)
def test_gelu_aux(out_dtype, with_bias):
    """aux = the pre-activation (with bias) in the output's dtype; D = gelu(pre-activation)."""
    rng = rng_for("gelu", dtype_id(out_dtype), with_bias)
    x, w = random_matrix(rng, (17, 33), out_dtype), random_matrix(rng, (19, 33), out_dtype)
    bias = random_matrix(rng, (1, 19)).reshape(19)
    d = np.zeros((17, 19), out_dtype)
    aux = np.full((17, 19), np.nan, np.float32).astype(out_dtype)
    extra = dict(bias=tensor(bias)) if with_bias else {}
    run_gemm(hp(x), hp(w), d, trans_b=True, epilogue=E.GELU_AUX, aux=tensor(aux), alpha=0.25, **extra)
    pre = 0.25 * (x.astype(np.float64) @ w.T.astype(np.float64)) + (bias if with_bias else 0)
    assert_close(aux, pre, TOL[np.dtype(out_dtype)], "aux")
    assert_close(d, gelu(pre), TOL[np.dtype(out_dtype)], "D")
    assert (pre < -1).any() and (pre > 1).any()  # both sides of the activation exercised


@pytest.mark.parametrize("out_dtype", SOURCE_TYPES, ids=dtype_id)
def test_dgelu(out_dtype):
    """dgrad of fc2 fused with gelu': D = (dy w) * gelu'(aux), aux the saved pre-activation."""
    rng = rng_for("dgelu", dtype_id(out_dtype))
    dy, w = random_matrix(rng, (12, 8), out_dtype), random_matrix(rng, (8, 21), out_dtype)
    aux = (random_matrix(rng, (12, 21)) * 2).astype(out_dtype)
    d = np.zeros((12, 21), out_dtype)
    run_gemm(hp(dy), hp(w), d, epilogue=E.DGELU, aux=tensor(aux))
    want = (dy.astype(np.float64) @ w.astype(np.float64)) * dgelu(aux.astype(np.float64))
    assert_close(d, want, TOL[np.dtype(out_dtype)])


@pytest.mark.parametrize("bgrad_dtype", [np.float32, BF16], ids=dtype_id)
@pytest.mark.parametrize("kind", ["fp32", "bf16", "fp8"])
def test_bgrad_is_the_column_sum_of_dy_in_wgrad(kind, bgrad_dtype):
    """wgrad dw = dy^T x with BGRAD: bias_grad[i] = sum over tokens of dy[:, i]."""
    rng = rng_for("bgrad", kind, dtype_id(bgrad_dtype))
    tokens, n_out, n_in = 150, 11, 13
    dtype = BF16 if kind == "bf16" else np.float32
    dy, x = random_matrix(rng, (tokens, n_out), dtype), random_matrix(rng, (tokens, n_in), dtype)
    if kind == "fp8":
        qdy, qx = quantize(dy, 0, O.E5M2), quantize(x, 0, O.E4M3)
        a, b = qdy.descriptor(), qx.descriptor()
        dy64 = dequantized_source(qdy, columnwise=True)
        x64 = dequantized_source(qx, columnwise=True)
    else:
        a, b = hp(dy), hp(x)
        dy64, x64 = dy.astype(np.float64), x.astype(np.float64)
    out_dtype = np.float32 if bgrad_dtype is np.float32 else BF16
    if kind == "bf16":
        out_dtype = BF16
    d = np.zeros((n_out, n_in), out_dtype)
    bgrad = np.full(n_out, np.nan, np.float32).astype(bgrad_dtype)
    cfg = _C.GemmConfig(trans_a=True, alpha=2.0, epilogue=E.BGRAD, bias_grad=tensor(bgrad))
    _C.gemm(a, b, hp(d), cfg)
    tol = TOL[np.dtype(bgrad_dtype)]
    assert_close(bgrad, dy64.sum(axis=0), tol, "bias_grad")  # op(A)'s row sums: alpha not applied
    assert_close(d, 2.0 * (dy64.T @ x64), TOL[np.dtype(out_dtype)], "D")


# ---- FP8 per-tensor ----------------------------------------------------------------------------

FP8_PAIRS = [(O.E4M3, O.E4M3), (O.E4M3, O.E5M2), (O.E5M2, O.E4M3)]


@pytest.mark.parametrize("fmts", FP8_PAIRS, ids=lambda p: f"{p[0]}x{p[1]}")
@pytest.mark.parametrize("trans_a,trans_b", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_fp8_per_tensor(shape, trans_a, trans_b, fmts):
    m, n, k = shape
    rng = rng_for("fp8", shape, trans_a, trans_b, fmts)
    a = random_matrix(rng, source_shape(m, k, trans_a, False))
    b = random_matrix(rng, source_shape(n, k, trans_b, True))
    qa, qb = quantize(a, 0, fmts[0]), quantize(b, 0, fmts[1])
    d = np.full((m, n), np.nan, np.float32)
    _C.gemm(qa.descriptor(), qb.descriptor(), hp(d), _C.GemmConfig(trans_a=trans_a, trans_b=trans_b))
    want = fp8_operand_value(qa, trans_a, False) @ fp8_operand_value(qb, trans_b, True)
    assert_close(d, want, 1e-5, "D vs the emulated reference")
    if fmts == (O.E4M3, O.E4M3) and k >= 16:
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        exact = (a64.T if trans_a else a64) @ (b64.T if trans_b else b64)
        assert_close(d, exact, 0.1, "D vs the unquantized product")


@pytest.mark.parametrize("out_dtype", [np.float16, BF16], ids=dtype_id)
@pytest.mark.parametrize("split", [-1, 0, 1])
def test_fp8_half_precision_output(out_dtype, split):
    rng = rng_for("fp8_half", dtype_id(out_dtype), split)
    x, w = random_matrix(rng, (33, 80)), random_matrix(rng, (24, 80))
    qx, qw = quantize(x, 0, O.E4M3), quantize(w, 0, O.E4M3)
    d = np.zeros((33, 24), out_dtype)
    _C.gemm(qx.descriptor(), qw.descriptor(), hp(d), _C.GemmConfig(trans_b=True, use_split_accumulator=split))
    want = fp8_operand_value(qx, False, False) @ fp8_operand_value(qw, True, True)
    assert_close(d, want, TOL[np.dtype(out_dtype)])


def test_fp8_reads_the_copy_the_layout_needs():
    """The two per-tensor copies hold the same values, so poison one: te must not read it."""
    rng = rng_for("copy_choice")
    dy, x = random_matrix(rng, (20, 6)), random_matrix(rng, (20, 5))
    qdy, qx = quantize(dy, 0, O.E5M2), quantize(x, 0, O.E4M3)
    qdy.rowwise[...] = 0x7F  # NaN in both formats; wgrad reads the column-wise copies only
    qx.rowwise[...] = 0x7F
    d = np.zeros((6, 5), np.float32)
    _C.gemm(qdy.descriptor(), qx.descriptor(), hp(d), _C.GemmConfig(trans_a=True))
    assert_close(d, dequantized_source(qdy, True).T @ dequantized_source(qx, True), 1e-5)


# ---- FP8 block scaling --------------------------------------------------------------------------

BLOCK_SHAPES = [(7, 13, 5), (129, 257, 65), (130, 140, 300), (0, 5, 3), (4, 5, 0)]


@pytest.mark.parametrize("dims", [(1, 1), (1, 2), (2, 1)], ids=["1Dx1D", "1Dx2D", "2Dx1D"])
@pytest.mark.parametrize("trans_a,trans_b", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("shape", BLOCK_SHAPES, ids=str)
def test_fp8_block(shape, trans_a, trans_b, dims):
    m, n, k = shape
    rng = rng_for("block", shape, trans_a, trans_b, dims)
    # Magnitudes varying by 2^+-6 across rows and columns: every block has its own scale, so a
    # scale read from the wrong place is far outside the tolerance.
    a = random_matrix(rng, source_shape(m, k, trans_a, False), spread=6)
    b = random_matrix(rng, source_shape(n, k, trans_b, True), spread=6)
    qa, qb = quantize(a, dims[0], O.E4M3), quantize(b, dims[1], O.E4M3)
    out_dtype = BF16 if k == 300 else np.float32
    d = np.zeros((m, n), out_dtype)
    _C.gemm(qa.descriptor(), qb.descriptor(), hp(d), _C.GemmConfig(trans_a=trans_a, trans_b=trans_b))
    want = fp8_operand_value(qa, trans_a, False) @ fp8_operand_value(qb, trans_b, True)
    assert_close(d, want, TOL[np.dtype(out_dtype)])
    if k >= 64 and m and n:
        # The test can tell the copies apart: reading the other copy's 1-D scales is far off.
        if dims[0] == 1:
            other = dequantized_source(qa, columnwise=not trans_a)
            wrong = (other.T if trans_a else other) @ fp8_operand_value(qb, trans_b, True)
            assert np.linalg.norm(wrong - want) > 1e-3 * np.linalg.norm(want)
        exact = (a.T if trans_a else a).astype(np.float64) @ (b.T if trans_b else b).astype(np.float64)
        assert_close(d, exact, 0.1, "D vs the unquantized product")


def test_fp8_block_e4m3_x_e5m2_with_bias_and_bgrad():
    rng = rng_for("block_mixed")
    dy, x = random_matrix(rng, (200, 40), spread=3), random_matrix(rng, (200, 24), spread=3)
    qdy, qx = quantize(dy, 1, O.E5M2), quantize(x, 1, O.E4M3)
    d = np.zeros((40, 24), np.float32)
    bgrad = np.zeros(40, np.float32)
    _C.gemm(
        qdy.descriptor(),
        qx.descriptor(),
        hp(d),
        _C.GemmConfig(trans_a=True, epilogue=E.BGRAD, bias_grad=tensor(bgrad)),
    )
    dy64, x64 = dequantized_source(qdy, True), dequantized_source(qx, True)
    assert_close(d, dy64.T @ x64, 1e-5)
    assert_close(bgrad, dy64.sum(axis=0), 1e-5)


# ---- FP8 output -------------------------------------------------------------------------------


def fp8_step(v: np.ndarray, fmt: str) -> np.ndarray:
    """The spacing of FP8 values at |v| (the subnormal spacing below the smallest normal)."""
    mant, emin = (3, -6) if fmt == O.E4M3 else (2, -14)
    e = np.floor(np.log2(np.maximum(np.abs(v), 2.0**emin)))
    return np.exp2(e - mant)


@pytest.mark.parametrize("amax_before", [None, 0.0, "above"], ids=["no_amax", "amax_0", "amax_above"])
@pytest.mark.parametrize("operands", ["bf16", "fp8"])
@pytest.mark.parametrize("fmt", [O.E4M3, O.E5M2])
def test_fp8_output(fmt, operands, amax_before):
    """amax is max-accumulated (te_quantize's delayed-scaling rule): from 0 it becomes the
    result's amax; a larger amax already there stays."""
    with_amax = amax_before is not None
    rng = rng_for("fp8_out", fmt, operands, str(amax_before))
    m, n, k = 37, 29, 70
    x, w = random_matrix(rng, (m, k)), random_matrix(rng, (n, k))
    bias = random_matrix(rng, (1, n)).reshape(n)
    if operands == "fp8":
        qx, qw = quantize(x, 0, O.E4M3), quantize(w, 0, O.E4M3)
        a, b = qx.descriptor(), qw.descriptor()
        x64, w64 = dequantized_source(qx, False), dequantized_source(qw, False)
    else:
        xb, wb = x.astype(BF16), w.astype(BF16)
        a, b = hp(xb), hp(wb)
        x64, w64 = xb.astype(np.float64), wb.astype(np.float64)
    want = x64 @ w64.T + bias
    # A scale that sends the largest results past fp8_max: saturation is exercised too.
    scale = np.float32(1.3 * float(O.FP8_MAX[fmt]) / np.abs(want).max())
    out = fp8_buffer((m, n))
    above = np.float32(2 * np.abs(want).max())
    amax = f32(above if amax_before == "above" else 0.0)
    scale_inv, scale_buf = f32(np.nan), f32(scale)
    d = _C.QuantizedTensor(
        int(M.PER_TENSOR),
        rowwise_data=tensor(out, FP8_DTYPE[fmt]),
        rowwise_scale_inv=tensor(scale_inv),
        amax=tensor(amax) if with_amax else None,
        scale=tensor(scale_buf),
    )
    _C.gemm(a, b, d, _C.GemmConfig(trans_b=True, epilogue=E.BIAS, bias=tensor(bias)))
    if amax_before == 0.0:
        np.testing.assert_allclose(amax[0], np.abs(want).max(), rtol=1e-5)
    elif amax_before == "above":
        assert amax[0] == above
    assert scale_inv[0] == np.float32(1) / scale
    scaled = want * np.float64(scale)
    got = O.from_fp8(out, fmt).astype(np.float64)
    expect = O.from_fp8(O.to_fp8(scaled.astype(np.float32), fmt), fmt).astype(np.float64)
    # fp32 accumulation may land on the other side of a rounding boundary: one FP8 step at most.
    assert (np.abs(got - expect) <= fp8_step(expect, fmt)).all()
    assert (got == expect).mean() > 0.95
    assert (np.abs(got) == float(O.FP8_MAX[fmt])).any()  # some saturated


@pytest.mark.parametrize("before", [0.5, np.nan])
def test_fp8_output_empty_leaves_amax_and_writes_scale_inv(before):
    out = fp8_buffer((0, 3))
    amax, scale_inv, scale = f32(before), f32(np.nan), f32(4.0)
    d = _C.QuantizedTensor(
        int(M.PER_TENSOR),
        rowwise_data=tensor(out, FP8_DTYPE[O.E4M3]),
        rowwise_scale_inv=tensor(scale_inv),
        amax=tensor(amax),
        scale=tensor(scale),
    )
    _C.gemm(hp(np.zeros((0, 2), np.float32)), hp(np.ones((2, 3), np.float32)), d)
    assert np.array_equal(amax, f32(before), equal_nan=True) and scale_inv[0] == 0.25


def test_fp8_output_amax_nan_propagates():
    x = np.ones((4, 8), np.float32)
    x[1, 2] = np.nan
    amax, scale_inv, scale = f32(3.0), f32(np.nan), f32(1.0)
    d = _C.QuantizedTensor(
        int(M.PER_TENSOR),
        rowwise_data=tensor(fp8_buffer((4, 5)), FP8_DTYPE[O.E4M3]),
        rowwise_scale_inv=tensor(scale_inv),
        amax=tensor(amax),
        scale=tensor(scale),
    )
    _C.gemm(hp(x), hp(np.ones((5, 8), np.float32)), d, _C.GemmConfig(trans_b=True))
    assert np.isnan(amax[0])


# ---- errors -------------------------------------------------------------------------------------


def raises(exc, pattern, *args, config=None):
    with pytest.raises(exc, match=pattern) as info:
        _C.gemm(*args, config)
    assert str(info.value) == _C.last_error() and str(info.value).startswith("te_gemm: ")
    return info.value


def fp8_pair(fmt_a=O.E4M3, fmt_b=O.E4M3, modes=(0, 0), a_shape=(8, 16), b_shape=(4, 16), **kw):
    rng = rng_for("err")
    qa = quantize(random_matrix(rng, a_shape), modes[0], fmt_a, **kw.get("a", {}))
    qb = quantize(random_matrix(rng, b_shape), modes[1], fmt_b, **kw.get("b", {}))
    return qa, qb


NT = _C.GemmConfig(trans_b=True)


def test_error_two_2d_operands():
    qa, qb = fp8_pair(modes=(2, 2))
    raises(
        ValueError,
        re.escape("b->scaling_mode: a GEMM may have at most one block_2d (128x128) operand"),
        qa.descriptor(),
        qb.descriptor(),
        hp(np.zeros((8, 4), np.float32)),
        config=NT,
    )


def test_error_e5m2_x_e5m2():
    qa, qb = fp8_pair(O.E5M2, O.E5M2)
    raises(
        ValueError,
        re.escape(
            "b->rowwise_data.dtype: expected float8_e4m3 when a is float8_e5m2 "
            "(E5M2 x E5M2 is not a supported FP8 GEMM"
        ),
        qa.descriptor(),
        qb.descriptor(),
        hp(np.zeros((8, 4), np.float32)),
        config=NT,
    )


def test_error_missing_columnwise_copy():
    qa, qb = fp8_pair(a_shape=(16, 8), a=dict(columnwise=False))  # wgrad-like A needs its transpose
    raises(
        ValueError,
        re.escape(
            "te_gemm: a->columnwise_data: trans_a = 1 needs the column-wise copy (quantize "
            "with columnwise usage), got NULL"
        ),
        qa.descriptor(),
        qb.descriptor(),
        hp(np.zeros((8, 4), np.float32)),
        config=_C.GemmConfig(trans_a=True, trans_b=True),
    )
    qa, qb = fp8_pair(b_shape=(16, 4), b=dict(columnwise=False))  # dgrad-like B
    raises(
        ValueError,
        re.escape("b->columnwise_data: trans_b = 0 needs the column-wise copy"),
        qa.descriptor(),
        qb.descriptor(),
        hp(np.zeros((8, 4), np.float32)),
    )
    qa, qb = fp8_pair(a=dict(rowwise=False))
    raises(
        ValueError,
        re.escape(
            "a->rowwise_data: trans_a = 0 needs the row-wise copy (quantize with rowwise usage), got NULL"
        ),
        qa.descriptor(),
        qb.descriptor(),
        hp(np.zeros((8, 4), np.float32)),
        config=NT,
    )


def test_error_k_mismatch():
    a, b = np.zeros((3, 5), np.float32), np.zeros((6, 4), np.float32)
    raises(
        ValueError,
        re.escape(
            "b: expected K = 5 (op(A) is [M, K] = [3, 5] with trans_a = 0), got "
            "K = 6 (b's source is [6, 4], read as [K, N] with trans_b = 0)"
        ),
        hp(a),
        hp(b),
        hp(np.zeros((3, 4), np.float32)),
    )


def test_error_wrong_d_shape():
    a, b = np.zeros((3, 5), np.float32), np.zeros((5, 4), np.float32)
    d = np.full((4, 3), 7.0, np.float32)
    raises(
        ValueError,
        re.escape("d->rowwise_data.shape: expected [3, 4] ([M, N]") + ".*got \\[4, 3\\]",
        hp(a),
        hp(b),
        hp(d),
    )
    assert (d == 7).all()  # a failed call writes nothing


def test_error_mixed_dtypes():
    a, b = np.zeros((3, 5), np.float32), np.zeros((5, 4), BF16)
    d = hp(np.zeros((3, 4), np.float32))
    raises(
        ValueError,
        re.escape(
            "b->rowwise_data.dtype: expected a's float32 (high-precision operands "
            "share one dtype), got bfloat16"
        ),
        hp(a),
        hp(b),
        d,
    )
    qa, _ = fp8_pair(a_shape=(3, 5))
    raises(
        ValueError,
        re.escape(
            "b->rowwise_data.dtype: expected an FP8 dtype like a's float8_e4m3 (te_gemm "
            "does not mix high-precision and FP8 operands), got float32"
        ),
        qa.descriptor(),
        hp(np.zeros((5, 4), np.float32)),
        d,
    )
    _, qb = fp8_pair(b_shape=(4, 5))
    raises(
        ValueError,
        re.escape("expected a high-precision dtype like a's float32"),
        hp(a),
        qb.descriptor(),
        d,
        config=NT,
    )
    qa, qb = fp8_pair(modes=(0, 1))
    raises(
        ValueError,
        re.escape("b->scaling_mode: expected per_tensor like a's per_tensor"),
        qa.descriptor(),
        qb.descriptor(),
        hp(np.zeros((8, 4), np.float32)),
        config=NT,
    )


def test_error_config_values():
    a, b, d = np.zeros((3, 5), np.float32), np.zeros((5, 4), np.float32), np.zeros((3, 4), np.float32)
    raises(
        ValueError,
        re.escape("config->epilogue: expected a te_gemm_epilogue value 0..4, got 7"),
        hp(a),
        hp(b),
        hp(d),
        config=_C.GemmConfig(epilogue=7),
    )
    raises(
        ValueError,
        re.escape("config->alpha: expected a finite value, got inf"),
        hp(a),
        hp(b),
        hp(d),
        config=_C.GemmConfig(alpha=float("inf")),
    )
    raises(
        ValueError,
        re.escape("config->beta: expected a finite value, got nan"),
        hp(a),
        hp(b),
        hp(d),
        config=_C.GemmConfig(beta=float("nan")),
    )
    raises(
        ValueError,
        re.escape("config->use_split_accumulator: expected -1 (default), 0 or 1, got 2"),
        hp(a),
        hp(b),
        hp(d),
        config=_C.GemmConfig(use_split_accumulator=2),
    )
    cfg = _C.GemmConfig()
    cfg.trans_a = 2
    raises(ValueError, re.escape("config->trans_a: expected 0 or 1, got 2"), hp(a), hp(b), hp(d), config=cfg)
    ws = np.zeros((2, 8), np.uint8)
    raises(
        ValueError,
        re.escape("config->workspace.shape: expected 1 dim (bytes), got [2, 8]"),
        hp(a),
        hp(b),
        hp(d),
        config=_C.GemmConfig(workspace=tensor(ws, int(D.UINT8))),
    )
    ws = np.zeros(64, np.uint8)  # a valid workspace is accepted and ignored on the CPU
    _C.gemm(hp(a), hp(b), hp(d), _C.GemmConfig(workspace=tensor(ws, int(D.UINT8))))


def test_error_epilogue_tensors():
    a, b = np.zeros((3, 5), np.float32), np.zeros((5, 4), np.float32)
    d = np.zeros((3, 4), np.float32)
    raises(
        ValueError,
        re.escape(
            "config->aux: epilogue GELU_AUX needs the [3, 4] aux (written: the pre-activation), got NULL"
        ),
        hp(a),
        hp(b),
        hp(d),
        config=_C.GemmConfig(epilogue=E.GELU_AUX),
    )
    raises(
        ValueError,
        re.escape("config->aux: epilogue DGELU needs the [3, 4] aux (read"),
        hp(a),
        hp(b),
        hp(d),
        config=_C.GemmConfig(epilogue=E.DGELU),
    )
    raises(
        ValueError,
        re.escape("config->bias: epilogue BIAS needs the [4] bias, got NULL"),
        hp(a),
        hp(b),
        hp(d),
        config=_C.GemmConfig(epilogue=E.BIAS),
    )
    raises(
        ValueError,
        re.escape("config->bias_grad: epilogue BGRAD needs the [3] bias_grad, got NULL"),
        hp(a),
        hp(b),
        hp(d),
        config=_C.GemmConfig(epilogue=E.BGRAD),
    )
    bias = np.zeros(4, np.float32)
    raises(
        ValueError,
        re.escape("config->bias: expected NULL with epilogue DEFAULT"),
        hp(a),
        hp(b),
        hp(d),
        config=_C.GemmConfig(bias=tensor(bias)),
    )
    bad = np.zeros(3, np.float32)
    raises(
        ValueError,
        re.escape("config->bias.shape: expected [4] ([N]: one per output column), got [3]"),
        hp(a),
        hp(b),
        hp(d),
        config=_C.GemmConfig(epilogue=E.BIAS, bias=tensor(bad)),
    )
    b16 = np.zeros(4, np.float16)
    raises(
        ValueError,
        re.escape("config->bias.dtype: expected float32, got float16"),
        hp(a),
        hp(b),
        hp(d),
        config=_C.GemmConfig(epilogue=E.BIAS, bias=tensor(b16)),
    )
    aux = np.zeros((3, 4), BF16)
    raises(
        ValueError,
        re.escape("config->aux.dtype: expected float32, got bfloat16"),
        hp(a),
        hp(b),
        hp(d),
        config=_C.GemmConfig(epilogue=E.GELU_AUX, aux=tensor(aux)),
    )


def fp8_output(shape=(8, 4), scale=1.0, fmt=O.E4M3):
    keep = (fp8_buffer(shape), f32(scale))
    return _C.QuantizedTensor(
        int(M.PER_TENSOR),
        rowwise_data=tensor(keep[0], FP8_DTYPE[fmt]),
        scale=None if scale is None else tensor(keep[1]),
    ), keep


def test_error_fp8_output_rules():
    qa, qb = fp8_pair(modes=(1, 2))
    d, keep = fp8_output()
    raises(
        ValueError,
        re.escape(
            "d->rowwise_data.dtype: expected float32, float16 or bfloat16 with "
            "block-scaled operands (a is block_1d), got float8_e4m3"
        ),
        qa.descriptor(),
        qb.descriptor(),
        d,
        config=NT,
    )
    qa, qb = fp8_pair()
    d, keep = fp8_output(scale=None)
    raises(
        ValueError,
        re.escape("d->scale: an FP8 output (float8_e4m3) needs the fp32 [1] scale"),
        qa.descriptor(),
        qb.descriptor(),
        d,
        config=NT,
    )
    d, keep = fp8_output()
    raises(
        ValueError,
        re.escape("config->beta: expected 0 with an FP8 output"),
        qa.descriptor(),
        qb.descriptor(),
        d,
        config=_C.GemmConfig(trans_b=True, beta=1.0),
    )
    assert (keep[0] == DATA_SENTINEL).all()
    hp_d = np.zeros((8, 4), np.float32)
    d = _C.QuantizedTensor(int(M.PER_TENSOR), rowwise_data=tensor(hp_d), scale=tensor(f32(1.0)))
    raises(
        ValueError,
        re.escape("d->scale: expected NULL for a float32 output (only an FP8 output has one)"),
        qa.descriptor(),
        qb.descriptor(),
        d,
        config=NT,
    )


def test_error_operand_scales_and_layouts():
    qa, qb = fp8_pair()
    da = qa.descriptor()
    da.rowwise_scale_inv = tensor(np.zeros(2, np.float32))
    raises(
        ValueError,
        re.escape("a->rowwise_scale_inv.shape: expected 1 element, got [2]"),
        da,
        qb.descriptor(),
        hp(np.zeros((8, 4), np.float32)),
        config=NT,
    )
    qa, qb = fp8_pair(modes=(1, 1))
    db = qb.descriptor()
    db.rowwise_scale_inv = tensor(np.zeros((1, 3), np.float32))
    raises(
        ValueError,
        re.escape(
            "b->rowwise_scale_inv.shape: expected [1, 4] (the block-scale layout of "
            "te/tensor.h for this operand), got [1, 3]"
        ),
        qa.descriptor(),
        db,
        hp(np.zeros((8, 4), np.float32)),
        config=NT,
    )
    a = np.zeros((3, 5), np.float32)
    da = _C.QuantizedTensor(int(M.PER_TENSOR), rowwise_data=tensor(a), rowwise_scale_inv=tensor(f32(1.0)))
    raises(
        ValueError,
        re.escape(
            "a->rowwise_scale_inv: expected NULL for a float32 operand (high "
            "precision has no scale), got a buffer"
        ),
        da,
        hp(np.zeros((5, 4), np.float32)),
        hp(np.zeros((3, 4), np.float32)),
    )
    da = _C.QuantizedTensor(int(M.BLOCK_1D), rowwise_data=tensor(a))
    raises(
        ValueError,
        re.escape("a->scaling_mode: expected per_tensor for a float32 operand"),
        da,
        hp(np.zeros((5, 4), np.float32)),
        hp(np.zeros((3, 4), np.float32)),
    )


def cuda(arr, dtype=None):
    t = tensor(arr, dtype)
    return _C.Tensor(t.ptr, t.dtype, t.shape, device_type=int(_C.DeviceType.CUDA), device_index=0)


def cuda_hp(arr):
    return _C.QuantizedTensor(int(M.PER_TENSOR), rowwise_data=cuda(arr))


@pytest.mark.skipif(_C.BUILT_WITH_CUDA, reason="checks the CPU-only build's message")
def test_error_cuda_tensors_on_cpu_only_build():
    a, b, d = np.zeros((3, 5), np.float32), np.zeros((5, 4), np.float32), np.zeros((3, 4), np.float32)
    raises(
        NotImplementedError,
        re.escape("te_gemm: a->rowwise_data is on cuda:0 but this te-core was built without CUDA"),
        cuda_hp(a),
        cuda_hp(b),
        cuda_hp(d),
    )


def test_error_mixed_devices():
    a, b, d = np.zeros((3, 5), np.float32), np.zeros((5, 4), np.float32), np.zeros((3, 4), np.float32)
    raises(
        ValueError,
        re.escape("b->rowwise_data.device: expected the device of a->rowwise_data (cpu), got cuda:0"),
        hp(a),
        cuda_hp(b),
        hp(d),
    )
    raises(
        ValueError,
        re.escape("d->rowwise_data.device: expected the device of a->rowwise_data (cpu), got cuda:0"),
        hp(a),
        hp(b),
        cuda_hp(d),
    )
