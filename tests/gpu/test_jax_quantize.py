"""te_jax.quantize on a CUDA device against the same call on the CPU backend, bit for bit.

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
