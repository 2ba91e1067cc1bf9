"""te_jax.gemm on the CPU backend.

References (NUMERICS.md "How to test numerics"), all as normwise relative error
||te - ref||_F / ||ref||_F:
  - high precision: the same product in float64 numpy of the operands' values;
    <= 1e-5 with an fp32 output, <= 1e-2 with bf16/fp16;
  - FP8: the emulated reference, the operands dequantized here in numpy from the very copy te
    reads (per-tensor data * scale_inv, block data * its block's scale_inv) and multiplied in
    float64; <= 1e-5 fp32 output, <= 1e-2 bf16; and loosely (<= 0.1) against the unquantized
    product of well-scaled random data.

Run: PYTHONPATH=packages/te-core/src:packages/te-jax/src pytest tests/jax/test_gemm.py
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import te_jax

E4M3, E5M2 = jnp.float8_e4m3fn, jnp.float8_e5m2
F32, BF16, F16 = jnp.float32, jnp.bfloat16, jnp.float16
TOL = {np.dtype(F32): 1e-5, np.dtype(BF16): 1e-2, np.dtype(F16): 1e-2}

# (trans_a, trans_b): a Linear layer's three GEMMs (te/gemm.h) and the fourth combination.
LAYOUTS = {"fprop": (False, True), "dgrad": (False, False), "wgrad": (True, False), "tt": (True, True)}


def _np(a) -> np.ndarray:
    return np.asarray(jax.device_get(a))


def _f64(a) -> np.ndarray:
    return _np(jnp.asarray(a).astype(F32)).astype(np.float64)


def _rel(actual, expected) -> float:
    actual = _f64(actual)
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


def _randn(shape, dtype=F32, seed=0, scale=1.0):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * np.float32(scale)
    return jnp.asarray(x, dtype)


def _sources(m, n, k, trans_a, trans_b, dtype=F32, seed=0):
    """x stored [M, K] or [K, M]; w stored [K, N] or [N, K] (te/gemm.h)."""
    x = _randn((k, m) if trans_a else (m, k), dtype, seed)
    w = _randn((n, k) if trans_b else (k, n), dtype, seed + 1)
    return x, w


def _op(a: np.ndarray, trans: bool) -> np.ndarray:
    a = a.reshape(-1, a.shape[-1])
    return a.T if trans else a


def _matmul(x, w, trans_a, trans_b) -> np.ndarray:
    return _op(np.asarray(x, np.float64), trans_a) @ _op(np.asarray(w, np.float64), trans_b)


def _dequant_copy(data, scale_inv, mode) -> np.ndarray:
    """One stored copy ([rows, cols], as te stores it) in float64. In the stored copy's own
    coordinates both block layouts share one formula (te/tensor.h): 1-D scale_inv[c // 128, r],
    2-D scale_inv[r // 128, c // 128]."""
    q = _np(data).astype(np.float32).astype(np.float64)
    q = q.reshape(-1, q.shape[-1])
    s = _np(scale_inv).astype(np.float64)
    if mode == "per_tensor":
        return q * s.reshape(-1)[0]
    r = np.arange(q.shape[0])[:, None]
    c = np.arange(q.shape[1])[None, :]
    if mode == "block_1d":
        return q * s[c // 128, r]
    return q * s[r // 128, c // 128]


def _dequant_used(t: te_jax.ScaledTensor, rowwise: bool) -> np.ndarray:
    """The source matrix [M, K] as te reads it: from the row-wise copy, or the column-wise one
    transposed back."""
    if rowwise:
        return _dequant_copy(t.data, t.scale_inv, t.scaling_mode)
    return _dequant_copy(t.columnwise_data, t.columnwise_scale_inv, t.scaling_mode).T


def _emulated(qx, qw, trans_a, trans_b) -> np.ndarray:
    a = _dequant_used(qx, rowwise=not trans_a)
    b = _dequant_used(qw, rowwise=trans_b)
    return _matmul(a, b, trans_a, trans_b)


def _gelu64(v):
    v = np.asarray(v, np.float64)
    return 0.5 * v * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3)))


# ---------------------------------------------------------------------------------------------
# High precision


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(37, 29, 70), (1, 1, 1), (64, 48, 256)], ids=str)
def test_high_precision(shape, dtype, layout):
    m, n, k = shape
    ta, tb = LAYOUTS[layout]
    x, w = _sources(m, n, k, ta, tb, dtype)
    d = te_jax.gemm(x, w, trans_a=ta, trans_b=tb)
    assert d.shape == (m, n) and d.dtype == dtype
    assert _rel(d, _matmul(_f64(x), _f64(w), ta, tb)) <= TOL[np.dtype(dtype)]
    # jnp.matmul in fp32, as a second reference
    ref32 = jnp.matmul(_op(jnp.asarray(x, F32), ta), _op(jnp.asarray(w, F32), tb), precision="highest")
    assert _rel(d, _f64(ref32)) <= TOL[np.dtype(dtype)]


@pytest.mark.parametrize("dtype", [BF16, F16], ids=lambda d: np.dtype(d).name)
def test_fp32_output_of_half_operands(dtype):
    x, w = _sources(33, 40, 100, False, True, dtype)
    d = te_jax.gemm(x, w, out_dtype=F32)
    assert d.dtype == F32
    # products of 16-bit values are exact in fp32: only the summation order differs
    assert _rel(d, _matmul(_f64(x), _f64(w), False, True)) <= 1e-5


def test_leading_dims_and_dense_layout():
    """Defaults: x [..., K] @ w.T with w [N, K]; the result keeps x's leading dims."""
    x = _randn((2, 3, 5, 24))
    w = _randn((16, 24), seed=1)
    b = _randn((16,), seed=2)
    d = te_jax.gemm(x, w, bias=b)
    assert d.shape == (2, 3, 5, 16)
    ref = np.einsum("...k,nk->...n", _f64(x), _f64(w)) + _f64(b)
    assert _rel(d, ref) <= 1e-5


# ---------------------------------------------------------------------------------------------
# FP8 per tensor (current scaling)

# layout -> (x's format, w's format): fprop both E4M3; dgrad and wgrad take E5M2 gradients as x
# (dy); "tt" covers E4M3 x E5M2.
FP8_CASES = {
    "fprop": (E4M3, E4M3),
    "dgrad": (E5M2, E4M3),
    "wgrad": (E5M2, E4M3),
    "tt": (E4M3, E5M2),
}


def _quantize_for(x, w, ta, tb, fx, fw, mode_x="per_tensor", mode_w="per_tensor", both=False):
    """Quantizes x and w with the copy the layout needs (or both copies)."""
    qx = te_jax.quantize(x, dtype=fx, scaling_mode=mode_x, rowwise=both or not ta, columnwise=both or ta)
    qw = te_jax.quantize(w, dtype=fw, scaling_mode=mode_w, rowwise=both or tb, columnwise=both or not tb)
    return qx, qw


@pytest.mark.parametrize("out", [F32, BF16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("layout", FP8_CASES)
@pytest.mark.parametrize("shape", [(48, 40, 96), (7, 13, 33)], ids=str)
def test_fp8_per_tensor(shape, layout, out):
    m, n, k = shape
    ta, tb = LAYOUTS[layout]
    fx, fw = FP8_CASES[layout]
    x, w = _sources(m, n, k, ta, tb, seed=3)
    qx, qw = _quantize_for(x, w, ta, tb, fx, fw)
    # only the copy the layout needs was made: te reads that one
    assert (qx.data is None) == ta and (qw.data is None) == (not tb)
    d = te_jax.gemm(qx, qw, out_dtype=out, trans_a=ta, trans_b=tb)
    assert d.shape == (m, n) and d.dtype == out
    assert _rel(d, _emulated(qx, qw, ta, tb)) <= TOL[np.dtype(out)]
    assert _rel(d, _matmul(_f64(x), _f64(w), ta, tb)) <= 0.1


def test_fp8_default_out_dtype_is_source_dtype():
    x, w = _sources(16, 16, 32, False, True, BF16)
    d = te_jax.gemm(te_jax.quantize(x), te_jax.quantize(w))
    assert d.dtype == BF16


@pytest.mark.parametrize("split", [True, False, None])
def test_fp8_split_accumulator_is_exact_on_cpu(split):
    """The CPU reference accumulates in fp32 either way; the flag only reaches cuBLASLt."""
    x, w = _sources(32, 24, 64, False, True, seed=4)
    qx, qw = te_jax.quantize(x), te_jax.quantize(w)
    d = te_jax.gemm(qx, qw, out_dtype=F32, use_split_accumulator=split)
    assert _rel(d, _emulated(qx, qw, False, True)) <= 1e-5


def test_fp8_both_copies_present_reads_the_needed_one():
    m, n, k = 40, 24, 64
    for layout, (ta, tb) in LAYOUTS.items():
        x, w = _sources(m, n, k, ta, tb, seed=5)
        qx, qw = _quantize_for(x, w, ta, tb, E4M3, E4M3, both=True)
        d = te_jax.gemm(qx, qw, out_dtype=F32, trans_a=ta, trans_b=tb)
        assert _rel(d, _emulated(qx, qw, ta, tb)) <= 1e-5, layout


def test_fp8_delayed_scaling_operands():
    x, w = _sources(32, 16, 48, False, True, seed=6)
    qx = te_jax.quantize(x, scale=jnp.full((1,), 64.0, F32))
    qw = te_jax.quantize(w, scale=jnp.full((1,), 128.0, F32))
    d = te_jax.gemm(qx, qw, out_dtype=F32)
    assert _rel(d, _emulated(qx, qw, False, True)) <= 1e-5
    assert _rel(d, _matmul(_f64(x), _f64(w), False, True)) <= 0.1


# ---------------------------------------------------------------------------------------------
# FP8 block scaling

BLOCK_CASES = [
    ("fprop", "block_1d", "block_2d"),
    ("fprop", "block_1d", "block_1d"),
    ("dgrad", "block_1d", "block_2d"),
    ("wgrad", "block_1d", "block_1d"),
    ("tt", "block_2d", "block_1d"),
]


@pytest.mark.parametrize("out", [F32, BF16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", BLOCK_CASES, ids=lambda c: "-".join(c))
@pytest.mark.parametrize("shape", [(130, 136, 300), (128, 128, 128)], ids=str)
def test_fp8_block(shape, case, out):
    m, n, k = shape
    layout, mode_x, mode_w = case
    ta, tb = LAYOUTS[layout]
    x, w = _sources(m, n, k, ta, tb, seed=7)
    qx, qw = _quantize_for(x, w, ta, tb, E4M3, E4M3, mode_x, mode_w)
    d = te_jax.gemm(qx, qw, out_dtype=out, trans_a=ta, trans_b=tb)
    assert d.shape == (m, n) and d.dtype == out
    assert _rel(d, _emulated(qx, qw, ta, tb)) <= TOL[np.dtype(out)]
    assert _rel(d, _matmul(_f64(x), _f64(w), ta, tb)) <= 0.1


def test_fp8_block_blocks_matter():
    """Rows of very different magnitude: 1x128 blocks keep each row's precision, one per-tensor
    scale flushes the small rows."""
    x = np.array(_randn((64, 256), seed=8))
    x[::2] *= 1e-5
    x = jnp.asarray(x)
    w = _randn((32, 256), seed=9)
    ref = _matmul(_f64(x), _f64(w), False, True)
    small = slice(0, None, 2)
    d_block = te_jax.gemm(
        te_jax.quantize(x, scaling_mode="block_1d"),
        te_jax.quantize(w, scaling_mode="block_2d"),
        out_dtype=F32,
    )
    d_tensor = te_jax.gemm(te_jax.quantize(x), te_jax.quantize(w), out_dtype=F32)
    err_block = _rel(_np(d_block)[small], ref[small])
    err_tensor = _rel(_np(d_tensor)[small], ref[small])
    assert err_block <= 0.1 and err_tensor > 2 * err_block, (err_block, err_tensor)


# ---------------------------------------------------------------------------------------------
# Epilogues


@pytest.mark.parametrize("out, bias_dtype", [(F32, F32), (BF16, BF16), (BF16, F32), (F16, F16)], ids=str)
def test_bias(out, bias_dtype):
    x, w = _sources(20, 24, 40, False, True, out)
    b = _randn((24,), bias_dtype, seed=10)
    d = te_jax.gemm(x, w, bias=b)
    assert d.dtype == out
    assert _rel(d, _matmul(_f64(x), _f64(w), False, True) + _f64(b)) <= TOL[np.dtype(out)]


def test_bias_fp8():
    x, w = _sources(32, 16, 64, False, True, seed=11)
    b = _randn((16,), seed=12)
    qx, qw = te_jax.quantize(x), te_jax.quantize(w)
    d = te_jax.gemm(qx, qw, bias=b, out_dtype=F32)
    assert _rel(d, _emulated(qx, qw, False, True) + _f64(b)) <= 1e-5


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("out", [F32, BF16], ids=lambda d: np.dtype(d).name)
def test_gelu(out, with_bias):
    x, w = _sources(24, 40, 48, False, True, out, seed=13)
    b = _randn((40,), out, seed=14) if with_bias else None
    d, pre = te_jax.gemm(x, w, bias=b, gelu=True)
    assert d.shape == pre.shape == (24, 40) and d.dtype == pre.dtype == out
    ref_pre = _matmul(_f64(x), _f64(w), False, True) + (_f64(b) if with_bias else 0.0)
    tol = TOL[np.dtype(out)]
    assert _rel(pre, ref_pre) <= tol
    assert _rel(d, _gelu64(ref_pre)) <= tol
    # gelu is the tanh approximation, as jax.nn.gelu(approximate=True) computes it
    assert _rel(d, _f64(jax.nn.gelu(pre.astype(F32), approximate=True))) <= tol
    if out == F32:  # and not the erf form
        assert _rel(d, _f64(jax.nn.gelu(pre, approximate=False))) > 1e-5


def test_gelu_fp8():
    x, w = _sources(32, 16, 64, False, True, seed=15)
    qx, qw = te_jax.quantize(x), te_jax.quantize(w)
    d, pre = te_jax.gemm(qx, qw, gelu=True, out_dtype=F32)
    ref_pre = _emulated(qx, qw, False, True)
    assert _rel(pre, ref_pre) <= 1e-5
    assert _rel(d, _gelu64(ref_pre)) <= 1e-5


def test_dgelu():
    """The dgrad through a gelu: (dy w) * gelu'(pre), pre the saved pre-activation."""
    dy = _randn((24, 40), seed=16)
    w = _randn((40, 32), seed=17)  # [N_out, K_in]: dgrad reads w [K, N] as stored
    pre = _randn((24, 32), seed=18)
    d = te_jax.gemm(dy, w, gelu_input=pre, trans_b=False)
    dgelu = jax.vmap(jax.grad(lambda v: jax.nn.gelu(v, approximate=True)))(pre.reshape(-1))
    ref = _matmul(_f64(dy), _f64(w), False, False) * _f64(dgelu).reshape(24, 32)
    assert _rel(d, ref) <= 1e-5


@pytest.mark.parametrize("out", [F32, BF16], ids=lambda d: np.dtype(d).name)
def test_bias_grad_wgrad_layout(out):
    """The wgrad layout dw = dy^T x with BGRAD gives dbias = dy.sum(0) in the same call."""
    t, n, k = 50, 24, 36
    dy = _randn((t, n), out, seed=19)
    x = _randn((t, k), out, seed=20)
    dw, db = te_jax.gemm(dy, x, trans_a=True, trans_b=False, bias_grad=True)
    assert dw.shape == (n, k) and db.shape == (n,) and db.dtype == out
    tol = TOL[np.dtype(out)]
    assert _rel(dw, _f64(dy).T @ _f64(x)) <= tol
    assert _rel(db, _f64(dy).sum(0)) <= tol
    assert _rel(db, _f64(jnp.sum(dy.astype(F32), axis=0))) <= tol


def test_bias_grad_fp8():
    t, n, k = 64, 32, 48
    dy = _randn((t, n), seed=21)
    x = _randn((t, k), seed=22)
    qdy = te_jax.quantize(dy, dtype=E5M2, rowwise=False, columnwise=True)
    qx = te_jax.quantize(x, rowwise=False, columnwise=True)
    dw, db = te_jax.gemm(qdy, qx, trans_a=True, trans_b=False, bias_grad=True, out_dtype=F32)
    dq_dy = _dequant_used(qdy, rowwise=False)
    assert _rel(dw, _emulated(qdy, qx, True, False)) <= 1e-5
    assert _rel(db, dq_dy.sum(0)) <= 1e-5
    assert _rel(db, _f64(dy).sum(0)) <= 0.1


# ---------------------------------------------------------------------------------------------
# accumulate_into (beta = 1)


def test_accumulate_into_twice():
    x, w = _sources(24, 16, 40, False, True, seed=23)
    acc0 = _randn((24, 16), seed=24)
    acc0_np = _np(acc0).copy()
    prod = _matmul(_f64(x), _f64(w), False, True)
    d1 = te_jax.gemm(x, w, accumulate_into=acc0)
    d2 = te_jax.gemm(x, w, accumulate_into=d1)
    assert d1.dtype == d2.dtype == F32
    assert _rel(d1, acc0_np + prod) <= 1e-5
    assert _rel(d2, acc0_np + 2 * prod) <= 1e-5
    np.testing.assert_array_equal(_np(acc0), acc0_np)  # functional: the argument is unchanged


def test_accumulate_into_under_jit_with_donation():
    """A wgrad accumulated into an fp32 main_grad twice in one jitted step, the buffer donated."""
    t, n, k = 40, 24, 32
    dy1, dy2 = _randn((t, n), BF16, seed=25), _randn((t, n), BF16, seed=26)
    x = _randn((t, k), BF16, seed=27)
    main_grad = _randn((n, k), seed=28)
    start = _np(main_grad).copy()

    def step(g, dy1, dy2, x):
        g = te_jax.gemm(dy1, x, trans_a=True, trans_b=False, accumulate_into=g)
        return te_jax.gemm(dy2, x, trans_a=True, trans_b=False, accumulate_into=g)

    out = jax.jit(step, donate_argnums=0)(main_grad, dy1, dy2, x)
    ref = start + _f64(dy1).T @ _f64(x) + _f64(dy2).T @ _f64(x)
    assert out.dtype == F32 and _rel(out, ref) <= 1e-5


def test_accumulate_into_fp8_wgrad():
    t, n, k = 64, 32, 48
    dy, x = _randn((t, n), seed=29), _randn((t, k), seed=30)
    qdy = te_jax.quantize(dy, dtype=E5M2, rowwise=False, columnwise=True)
    qx = te_jax.quantize(x, rowwise=False, columnwise=True)
    acc = jnp.ones((n, k), F32)
    d = te_jax.gemm(qdy, qx, trans_a=True, trans_b=False, accumulate_into=acc)
    assert d.dtype == F32
    assert _rel(d, 1.0 + _emulated(qdy, qx, True, False)) <= 1e-5


def test_accumulate_into_leading_dims():
    x = _randn((2, 6, 16))
    w = _randn((8, 16), seed=1)
    acc = _randn((2, 6, 8), seed=2)
    d = te_jax.gemm(x, w, accumulate_into=acc)
    assert d.shape == (2, 6, 8)
    assert _rel(d, _f64(acc) + np.einsum("...k,nk->...n", _f64(x), _f64(w))) <= 1e-5


# ---------------------------------------------------------------------------------------------
# jit, vmap


def test_jit_matches_eager_bitwise():
    x, w = _sources(33, 17, 130, False, True, seed=31)
    b = _randn((17,), seed=32)
    qx, qw = te_jax.quantize(x, scaling_mode="block_1d"), te_jax.quantize(w, scaling_mode="block_2d")
    cases = [
        lambda x, w, b: te_jax.gemm(x, w, bias=b),
        lambda x, w, b: te_jax.gemm(x, w, bias=b, gelu=True),
        lambda x, w, b: te_jax.gemm(qx, qw, bias=b, out_dtype=BF16),
        lambda x, w, b: te_jax.gemm(x, w, accumulate_into=jnp.ones((33, 17), F32)),
    ]
    for f in cases:
        eager = jax.tree.leaves(f(x, w, b))
        jitted = jax.tree.leaves(jax.jit(f)(x, w, b))
        for e, j in zip(eager, jitted, strict=True):
            np.testing.assert_array_equal(_np(e), _np(j))


def test_jit_with_scaled_tensor_arguments():
    x, w = _sources(16, 24, 32, False, True, seed=33)
    qx, qw = te_jax.quantize(x), te_jax.quantize(w)
    d = jax.jit(lambda a, b: te_jax.gemm(a, b, out_dtype=F32))(qx, qw)
    np.testing.assert_array_equal(_np(d), _np(te_jax.gemm(qx, qw, out_dtype=F32)))


def test_quantize_and_gemm_in_one_jit():
    x, w = _sources(16, 24, 32, False, True, seed=34)

    @jax.jit
    def f(x, w):
        return te_jax.gemm(te_jax.quantize(x), te_jax.quantize(w), out_dtype=F32)

    d = f(x, w)
    assert _rel(d, _emulated(te_jax.quantize(x), te_jax.quantize(w), False, True)) <= 1e-5


def test_vmap_runs_per_batch_element():
    x = _randn((3, 8, 16))
    w = _randn((12, 16), seed=1)
    d = jax.vmap(lambda a: te_jax.gemm(a, w))(x)
    assert d.shape == (3, 8, 12)
    assert _rel(d, np.einsum("bmk,nk->bmn", _f64(x), _f64(w))) <= 1e-5


# ---------------------------------------------------------------------------------------------
# Errors


def test_error_k_mismatch():
    x, w = _randn((8, 16)), _randn((4, 12))
    with pytest.raises(ValueError, match=r"gemm: op\(A\) is \[8, 16\] but op\(B\) is \[12, 4\]"):
        te_jax.gemm(x, w)
    with pytest.raises(ValueError, match=r"inner dimensions must match"):
        jax.jit(te_jax.gemm)(x, w)


def test_error_missing_columnwise_copy():
    x, w = _sources(16, 16, 32, False, False, seed=35)
    qx = te_jax.quantize(x)
    qw = te_jax.quantize(w)  # row-wise only; dgrad reads w's column-wise copy
    with pytest.raises(
        ValueError,
        match=r"w: trans_b=False reads the column-wise FP8 copy .* quantize w with columnwise=True",
    ):
        te_jax.gemm(qx, qw, trans_b=False)
    with pytest.raises(ValueError, match=r"x: trans_a=True .* quantize x with columnwise=True"):
        te_jax.gemm(qx, te_jax.quantize(w, rowwise=False, columnwise=True), trans_a=True, trans_b=False)
    qx_col = te_jax.quantize(x, rowwise=False, columnwise=True)
    with pytest.raises(ValueError, match=r"x: trans_a=False reads the row-wise FP8 copy"):
        te_jax.gemm(qx_col, te_jax.quantize(w, columnwise=True), trans_b=False)


def test_error_two_block_2d_operands():
    x, w = _sources(128, 128, 128, False, True, seed=36)
    qx = te_jax.quantize(x, scaling_mode="block_2d")
    qw = te_jax.quantize(w, scaling_mode="block_2d")
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"at most one block_2d"):
        te_jax.gemm(qx, qw)


def test_errors_from_te():
    """What te_gemm checks comes back with its message."""
    x, w = _sources(16, 8, 32, False, True, seed=37)
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"operands share one dtype"):
        te_jax.gemm(x.astype(BF16), w)
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"te_gemm does not mix"):
        te_jax.gemm(te_jax.quantize(x), w)
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"config->bias.shape: expected \[8\]"):
        te_jax.gemm(x, w, bias=jnp.zeros((9,), F32))
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"E5M2 x E5M2 is not a supported"):
        te_jax.gemm(te_jax.quantize(x, dtype=E5M2), te_jax.quantize(w, dtype=E5M2))
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"config->aux.shape: expected \[16, 8\]"):
        te_jax.gemm(x, w, gelu_input=jnp.zeros((16, 9), F32))


def test_errors_of_arguments():
    x, w = _sources(16, 8, 32, False, True, seed=38)
    with pytest.raises(TypeError, match=r"trans_b: expected True or False, got 1"):
        te_jax.gemm(x, w, trans_b=1)
    with pytest.raises(TypeError, match=r"out_dtype: expected one of .*, got float8_e4m3fn"):
        te_jax.gemm(x, w, out_dtype=E4M3)
    with pytest.raises(TypeError, match=r"use_split_accumulator: expected True or False"):
        te_jax.gemm(x, w, use_split_accumulator="yes")
    with pytest.raises(ValueError, match=r"bias_grad: expected no bias, gelu or gelu_input"):
        te_jax.gemm(x, w, bias=jnp.zeros((8,)), bias_grad=True)
    with pytest.raises(ValueError, match=r"gelu_input: expected no bias or gelu"):
        te_jax.gemm(x, w, gelu=True, gelu_input=jnp.zeros((16, 8)))
    with pytest.raises(ValueError, match=r"accumulate_into: expected the result's shape \(16, 8\)"):
        te_jax.gemm(x, w, accumulate_into=jnp.zeros((8, 16), F32))
    with pytest.raises(TypeError, match=r"accumulate_into: expected out_dtype's bfloat16 .*float32"):
        te_jax.gemm(x, w, accumulate_into=jnp.zeros((16, 8), F32), out_dtype=BF16)
    with pytest.raises(TypeError, match=r"accumulate_into: expected a high-precision array"):
        te_jax.gemm(x, w, accumulate_into=te_jax.quantize(jnp.zeros((16, 8))))


def test_scaled_tensor_is_a_dataclass_copy():
    """The tests' emulated reference reads the copy te reads; this pins how a ScaledTensor
    without its row-wise copy looks."""
    q = te_jax.quantize(_randn((8, 16)), columnwise=True)
    q_col = dataclasses.replace(q, data=None, scale_inv=None)
    np.testing.assert_array_equal(_dequant_used(q, False), _dequant_used(q_col, False))
    np.testing.assert_array_equal(_dequant_used(q, True), _dequant_used(q, False))
