"""te_jax.quantize on a CUDA device against the same call on the CPU backend, bit for bit (every
scaling mode, MXFP8 and NVFP4 included), and te_jax.gemm of MXFP8 / NVFP4 operands.

Skipped, with the reason, where jax sees no GPU or te-core was built without CUDA. Run on the GPU
machine: PYTHONPATH=packages/te-core/src:packages/te-jax/src pytest tests/gpu/test_jax_quantize.py
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import te_jax
from _jax_devices import CPU, GPU, SKIP_WITHOUT_GPU

pytestmark = SKIP_WITHOUT_GPU

SHAPES = [(1, 1), (7, 13), (1000, 3), (4, 5, 6), (129, 257), (256, 384), (2, 130, 129)]


def _random(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    x *= np.float32(10.0) ** rng.uniform(-4, 4, shape).astype(np.float32)
    flat = x.reshape(-1)
    if flat.size > 8:
        flat[:4] = [0.0, np.inf, -np.inf, 1e-40]  # zero, saturation, a subnormal
        idx = rng.integers(0, flat.size, flat.size // 10)
        flat[idx] = rng.integers(-64, 64, idx.size) * 0.5 + 0.25  # rounding ties once scaled
    if dtype == jnp.float16:
        x = np.clip(x, -6e4, 6e4)
    return x.astype(np.dtype(dtype))


def _valid(q, name):
    """The part as numpy, without the block-scale padding te never writes."""
    v = getattr(q, name)
    if v is None:
        return None
    v = np.asarray(jax.device_get(v))
    k = q.shape[-1]
    m = math.prod(q.shape) // k
    if q.scaling_mode == "block_1d":
        v = v[:, :m] if name == "scale_inv" else v[:, :k] if name == "columnwise_scale_inv" else v
    elif q.scaling_mode == "block_2d":
        if name == "scale_inv":
            v = v[:, : math.ceil(k / 128)]
        elif name == "columnwise_scale_inv":
            v = v[:, : math.ceil(m / 128)]
    return v.view(np.uint8) if v.dtype.itemsize == 1 else v.view(np.uint32)


PARTS = ["data", "scale_inv", "columnwise_data", "columnwise_scale_inv", "amax", "scale"]


def _on(device, fn, *args):
    args = [jax.device_put(a, device) for a in args]
    out = jax.jit(fn)(*args)
    leaves = jax.tree_util.tree_leaves(out)
    assert all(leaf.devices() == {device} for leaf in leaves)
    return out


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("src", [jnp.float32, jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("fp8", [jnp.float8_e4m3fn, jnp.float8_e5m2])
@pytest.mark.parametrize("mode", ["per_tensor", "per_tensor_delayed", "block_1d", "block_2d"])
def test_cuda_matches_cpu_bit_for_bit(mode, fp8, src, shape):
    x = jnp.asarray(_random(shape, src, seed=len(shape) * 1000 + shape[-1]))
    if mode == "per_tensor_delayed":

        def fn(x, scale, amax):
            return te_jax.quantize(x, dtype=fp8, scale=scale, amax=amax, columnwise=True)

        args = (x, jnp.asarray([0.37], jnp.float32), jnp.asarray([1.5], jnp.float32))
    else:

        def fn(x):
            return te_jax.quantize(x, dtype=fp8, scaling_mode=mode, columnwise=True)

        args = (x,)
    q_cpu, q_gpu = _on(CPU, fn, *args), _on(GPU, fn, *args)
    for name in PARTS:
        a, b = _valid(q_cpu, name), _valid(q_gpu, name)
        assert (a is None) == (b is None), name
        if a is not None:
            np.testing.assert_array_equal(b, a, err_msg=f"{name} differs between CUDA and CPU")
    for dt in [jnp.float32, jnp.bfloat16]:
        y_cpu = _on(CPU, lambda q, dt=dt: q.dequantize(dt), q_cpu)
        y_gpu = _on(GPU, lambda q, dt=dt: q.dequantize(dt), q_gpu)
        np.testing.assert_array_equal(np.asarray(y_gpu).view(np.uint8), np.asarray(y_cpu).view(np.uint8))


def test_cuda_delayed_amax_accumulates_on_device():
    x = jax.device_put(jnp.asarray([[1.0, -4.0], [2.0, 3.0]], jnp.float32), GPU)
    scale = jax.device_put(jnp.asarray([2.0], jnp.float32), GPU)

    @jax.jit
    def step(running):
        for f in (0.5, 3.0, 1.0):
            running = te_jax.quantize(x * f, scale=scale, amax=running).amax
        return running

    assert np.asarray(step(jax.device_put(jnp.zeros((1,)), GPU))).tolist() == [12.0]
    assert np.asarray(step(jax.device_put(jnp.asarray([20.0]), GPU))).tolist() == [20.0]


MX_CASES = [
    ("mxfp8_1d", dict(dtype=jnp.float8_e4m3fn)),
    ("mxfp8_1d", dict(dtype=jnp.float8_e5m2, with_2d_quantization=True)),
    ("nvfp4_1d", {}),
    ("nvfp4_1d", dict(with_2d_quantization=True)),
    ("nvfp4_1d", dict(columnwise_rht=True)),
    ("nvfp4_1d", dict(columnwise_rht=True, rng=True)),
]


@pytest.mark.parametrize("shape", [(160, 258), (2, 64, 96)], ids=str)
@pytest.mark.parametrize("src", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("mode,kw", MX_CASES, ids=lambda c: str(c))
def test_mx_cuda_matches_cpu_bit_for_bit(mode, kw, src, shape):
    """te_jax's MXFP8 / NVFP4 on CUDA and CPU: every byte (scale padding left out), the amaxes,
    and dequantize. Stochastic rounding takes the key as a jit argument: the Philox seed is
    computed on the device and read there by the kernel."""
    x = np.asarray(_random(shape, np.float32, seed=shape[-1]), np.float32)
    x = jnp.asarray(np.nan_to_num(x, posinf=1e4, neginf=-1e4) / 100, src)  # NVFP4: one finite amax
    kw = dict(kw)
    sr = kw.pop("rng", False)

    def fn(x, key):
        return te_jax.quantize(x, scaling_mode=mode, columnwise=True, rng=key if sr else None, **kw)

    args = (x, jax.random.PRNGKey(5))
    q_cpu, q_gpu = _on(CPU, fn, *args), _on(GPU, fn, *args)
    m = math.prod(shape[:-1])
    k = shape[-1]
    block = 32 if mode == "mxfp8_1d" else 16
    valid = {"scale_inv": (m, -(-k // block)), "columnwise_scale_inv": (k, -(-m // block))}
    for name in PARTS:
        a, b = getattr(q_cpu, name), getattr(q_gpu, name)
        assert (a is None) == (b is None), name
        if a is None:
            continue
        a, b = np.asarray(jax.device_get(a)), np.asarray(jax.device_get(b))
        if name in valid:
            r, c = valid[name]
            a, b = a[:r, :c], b[:r, :c]
        view = np.uint8 if a.dtype.itemsize == 1 else np.uint32
        np.testing.assert_array_equal(
            b.view(view), a.view(view), err_msg=f"{name} differs between CUDA and CPU"
        )
    y_cpu = _on(CPU, lambda q: q.dequantize(jnp.float32), q_cpu)
    y_gpu = _on(GPU, lambda q: q.dequantize(jnp.float32), q_gpu)
    np.testing.assert_array_equal(np.asarray(y_gpu).view(np.uint32), np.asarray(y_cpu).view(np.uint32))


@pytest.mark.parametrize("mode", ["mxfp8_1d", "nvfp4_1d"])
def test_mx_gemm_cuda_matches_cpu(mode):
    """te_gemm's BF16 block-dequantized product on CUDA (cuBLASLt) and on the CPU: the same BF16
    operands, fp32 accumulation in another order (normwise <= 1e-5)."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((256, 384)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((128, 384)), jnp.float32)

    def fn(x, w):
        qx = te_jax.quantize(x, scaling_mode=mode, columnwise=True, columnwise_rht=mode == "nvfp4_1d")
        qw = te_jax.quantize(w, scaling_mode=mode)
        return te_jax.gemm(qx, qw), te_jax.gemm(qx, qx, trans_a=True, trans_b=False)

    for c, g in zip(_on(CPU, fn, x, w), _on(GPU, fn, x, w), strict=True):
        c, g = np.asarray(c, np.float64), np.asarray(g, np.float64)
        assert np.linalg.norm(g - c) / np.linalg.norm(c) <= 1e-5
