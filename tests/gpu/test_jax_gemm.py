"""te_jax.gemm on a CUDA device (cuBLASLt) against the same call on te's CPU backend.

Operands are made once on the CPU (FP8 ones with te_jax.quantize there) and copied byte for byte
to the GPU, so both backends read identical inputs. Tolerances as tests/gpu/test_gemm.py
(normwise relative error ||gpu - cpu||_F / ||cpu||_F):
  fp32 output, fp32/bf16/fp16 operands   <= 1e-5 (summation order only)
  fp32 output, FP8 operands              <= 4e-4 (split accumulation; tests/gpu/test_gemm.py says why) / 2e-3 (fast accumulation)
  bf16/fp16 output                       <= 1e-2
Skipped, with the reason, where jax sees no GPU or te-core was built without CUDA. Run on the GPU
machine: PYTHONPATH=packages/te-core/src:packages/te-jax/src pytest tests/gpu/test_jax_gemm.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import te_jax
from _jax_devices import CPU, GPU, SKIP_WITHOUT_GPU

pytestmark = SKIP_WITHOUT_GPU

E4M3, E5M2 = jnp.float8_e4m3fn, jnp.float8_e5m2
F32, BF16, F16 = jnp.float32, jnp.bfloat16, jnp.float16
LAYOUTS = {"fprop": (False, True), "dgrad": (False, False), "wgrad": (True, False), "tt": (True, True)}


def _np64(a) -> np.ndarray:
    return np.asarray(jax.device_get(jnp.asarray(a).astype(F32))).astype(np.float64)


def _rel(gpu, cpu) -> float:
    g, c = _np64(gpu), _np64(cpu)
    assert g.shape == c.shape, (g.shape, c.shape)
    assert np.all(np.isfinite(g)), "non-finite values in the GPU result"
    return float(np.linalg.norm(g - c) / np.linalg.norm(c))


def _randn(shape, dtype=F32, seed=0):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return jax.device_put(jnp.asarray(x, dtype), CPU)


def _on(device, fn, *args):
    """fn jitted on `device`, its (pytree) arguments copied there first."""
    args = jax.device_put(args, device)
    out = jax.block_until_ready(jax.jit(fn)(*args))  # a te error surfaces here, not later
    leaves = jax.tree_util.tree_leaves(out)
    assert all(leaf.devices() == {device} for leaf in leaves)
    return out


def _compare(fn, *args, tol):
    cpu, gpu = _on(CPU, fn, *args), _on(GPU, fn, *args)
    for c, g in zip(jax.tree_util.tree_leaves(cpu), jax.tree_util.tree_leaves(gpu), strict=True):
        assert c.dtype == g.dtype and c.shape == g.shape
        err = _rel(g, c)
        assert err <= tol, f"normwise relative error {err:.3g} > {tol}"


def _sources(m, n, k, ta, tb, dtype=F32, seed=0):
    return _randn((k, m) if ta else (m, k), dtype, seed), _randn((n, k) if tb else (k, n), dtype, seed + 1)


def _quantize_for(x, w, ta, tb, fx, fw, mode_x="per_tensor", mode_w="per_tensor"):
    with jax.default_device(CPU):
        qx = te_jax.quantize(x, dtype=fx, scaling_mode=mode_x, rowwise=not ta, columnwise=ta)
        qw = te_jax.quantize(w, dtype=fw, scaling_mode=mode_w, rowwise=tb, columnwise=not tb)
    return qx, qw


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(16, 16, 16), (7, 13, 5), (129, 257, 65), (256, 8, 1000)], ids=str)
def test_high_precision(shape, dtype, layout):
    m, n, k = shape
    ta, tb = LAYOUTS[layout]
    x, w = _sources(m, n, k, ta, tb, dtype)
    _compare(lambda x, w: te_jax.gemm(x, w, trans_a=ta, trans_b=tb), x, w, tol=1e-2 if dtype != F32 else 1e-5)
    _compare(lambda x, w: te_jax.gemm(x, w, trans_a=ta, trans_b=tb, out_dtype=F32), x, w, tol=1e-5)


FP8_CASES = {"fprop": (E4M3, E4M3), "dgrad": (E5M2, E4M3), "wgrad": (E5M2, E4M3), "tt": (E4M3, E5M2)}


@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize("out", [F32, BF16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("layout", FP8_CASES)
@pytest.mark.parametrize("shape", [(48, 80, 32), (64, 128, 96), (512, 1024, 256)], ids=str)
def test_fp8_per_tensor(shape, layout, out, split):
    m, n, k = shape
    ta, tb = LAYOUTS[layout]
    qx, qw = _quantize_for(*_sources(m, n, k, ta, tb, seed=3), ta, tb, *FP8_CASES[layout])
    tol = 1e-2 if out != F32 else (4e-4 if split else 2e-3)

    def fn(qx, qw):
        return te_jax.gemm(qx, qw, out_dtype=out, trans_a=ta, trans_b=tb, use_split_accumulator=split)

    _compare(fn, qx, qw, tol=tol)


BLOCK_CASES = [
    ("fprop", "block_1d", "block_2d"),
    ("fprop", "block_1d", "block_1d"),
    ("dgrad", "block_1d", "block_2d"),
    ("wgrad", "block_1d", "block_1d"),
]


@pytest.mark.parametrize("out", [F32, BF16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", BLOCK_CASES, ids=lambda c: "-".join(c))
@pytest.mark.parametrize("shape", [(128, 128, 128), (48, 80, 128), (256, 384, 640)], ids=str)
def test_fp8_block(shape, case, out):
    m, n, k = shape
    layout, mode_x, mode_w = case
    ta, tb = LAYOUTS[layout]
    qx, qw = _quantize_for(*_sources(m, n, k, ta, tb, seed=7), ta, tb, E4M3, E4M3, mode_x, mode_w)
    _compare(
        lambda qx, qw: te_jax.gemm(qx, qw, out_dtype=out, trans_a=ta, trans_b=tb),
        qx,
        qw,
        tol=4e-4 if out == F32 else 1e-2,
    )


@pytest.mark.parametrize("out", [F32, BF16], ids=lambda d: np.dtype(d).name)
def test_epilogues(out):
    tol = 1e-5 if out == F32 else 1e-2
    x, w = _sources(64, 128, 96, False, True, out, seed=11)
    b = _randn((128,), out, seed=12)
    _compare(lambda x, w, b: te_jax.gemm(x, w, bias=b), x, w, b, tol=tol)
    _compare(lambda x, w, b: te_jax.gemm(x, w, bias=b, gelu=True), x, w, b, tol=tol)
    _compare(lambda x, w: te_jax.gemm(x, w, gelu=True), x, w, tol=tol)
    dy, pre = _randn((64, 128), out, seed=13), _randn((64, 96), out, seed=14)
    _compare(lambda dy, w, pre: te_jax.gemm(dy, w, gelu_input=pre, trans_b=False), dy, w, pre, tol=tol)
    xs = _randn((64, 96), out, seed=15)
    _compare(lambda dy, x: te_jax.gemm(dy, x, trans_a=True, trans_b=False, bias_grad=True), dy, xs, tol=tol)


def test_epilogues_fp8():
    x, w = _sources(64, 128, 96, False, True, seed=16)
    qx, qw = _quantize_for(x, w, False, True, E4M3, E4M3)
    b = _randn((128,), seed=17)
    _compare(lambda qx, qw, b: te_jax.gemm(qx, qw, bias=b, out_dtype=F32), qx, qw, b, tol=4e-4)
    _compare(lambda qx, qw, b: te_jax.gemm(qx, qw, bias=b, gelu=True, out_dtype=BF16), qx, qw, b, tol=1e-2)
    dy, xs = _randn((64, 128), seed=18), _randn((64, 96), seed=19)
    with jax.default_device(CPU):
        qdy = te_jax.quantize(dy, dtype=E5M2, rowwise=False, columnwise=True)
        qxs = te_jax.quantize(xs, rowwise=False, columnwise=True)
    _compare(
        lambda a, b: te_jax.gemm(a, b, trans_a=True, trans_b=False, bias_grad=True, out_dtype=F32),
        qdy,
        qxs,
        tol=4e-4,
    )


def test_accumulate_into_twice():
    dy, x = _randn((64, 128), BF16, seed=20), _randn((64, 96), BF16, seed=21)
    g0 = _randn((128, 96), seed=22)

    def fn(g, dy, x):
        g = te_jax.gemm(dy, x, trans_a=True, trans_b=False, accumulate_into=g)
        return te_jax.gemm(dy, x, trans_a=True, trans_b=False, accumulate_into=g)

    _compare(fn, g0, dy, x, tol=1e-5)
    g_gpu = jax.device_put(g0, GPU)
    out = jax.jit(fn)(g_gpu, jax.device_put(dy, GPU), jax.device_put(x, GPU))
    np.testing.assert_array_equal(np.asarray(g_gpu), np.asarray(g0))  # functional
    ref = _np64(g0) + 2 * _np64(dy).T @ _np64(x)
    assert _rel(out, ref) <= 1e-5


def test_error_two_block_2d_operands_on_cuda():
    x, w = _sources(128, 128, 128, False, True, seed=23)
    qx, qw = _quantize_for(x, w, False, True, E4M3, E4M3, "block_2d", "block_2d")
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"at most one block_2d"):
        _on(GPU, lambda a, b: te_jax.gemm(a, b), qx, qw)
