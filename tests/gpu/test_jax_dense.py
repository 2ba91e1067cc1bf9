"""te_jax.dense on a CUDA device against the same call on te's CPU backend.

The functional dense op only (the Flax modules, norms and MLPs: tests/gpu/test_jax_flax.py), with a
token count that is a multiple of 16 and one that is not (21: te_jax pads each shard's rows for the
FP8 GEMMs and slices the results back). Inputs are made once on the CPU and copied to the GPU. Tolerances (normwise relative error, gpu vs cpu): 1e-5 for fp32 high precision,
2e-3 for FP8 recipes (fprop uses fast accumulation under Float8CurrentScaling).

Run on the GPU machine: PYTHONPATH=packages/te-core/src:packages/te-jax/src pytest tests/gpu/test_jax_dense.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import te_jax
from _jax_devices import CPU, GPU, SKIP_WITHOUT_GPU
from te_jax import recipe

pytestmark = SKIP_WITHOUT_GPU


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


@pytest.mark.parametrize(
    "r,tol",
    [(None, 1e-5), (recipe.Float8CurrentScaling(), 2e-3), (recipe.Float8BlockScaling(), 2e-3)],
    ids=["hp", "current", "block"],
)
@pytest.mark.parametrize("use_bias", [True, False])
@pytest.mark.parametrize("lead", [(2, 128), (3, 7)], ids=["256tok", "21tok"])
def test_dense_gpu_matches_cpu(r, tol, use_bias, lead):
    ks = jax.random.split(jax.random.PRNGKey(0), 4)
    with jax.default_device(CPU):
        x = jax.random.normal(ks[0], (*lead, 256), jnp.float32)
        w = jax.random.normal(ks[1], (256, 384), jnp.float32) / 16
        b = jax.random.normal(ks[2], (384,), jnp.float32) if use_bias else None
        dy = jax.random.normal(ks[3], (*lead, 384), jnp.float32)

    def run(device):
        args = jax.device_put((x, w, b, dy), device)
        f = jax.jit(lambda x, w, b: te_jax.dense(x, w, b, recipe=r))
        y, vjp = jax.vjp(f, *args[:3])
        return (y,) + tuple(vjp(args[3]))

    cpu, gpu = run(CPU), run(GPU)
    for name, c, g in zip(("y", "dx", "dkernel", "dbias"), cpu, gpu, strict=False):
        if c is None:
            assert g is None
            continue
        assert rel(g, c) <= tol, (name, rel(g, c))
