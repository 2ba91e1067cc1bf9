"""te_jax.flax modules on a CUDA device against the same calls on te's CPU backend: forward,
gradients and (DelayedScaling) the next fp8_metas state, jitted.

Inputs and parameters are made once on the CPU and copied to the GPU. The loss, a mean of
sin(y) near 0, agrees within 1e-6 absolute in fp32 (1e-4 under FP8). Gradients (normwise
relative error, GPU vs CPU): 5e-5 in fp32 high precision (a bias gradient is a sum over 512
tokens with cancellation, and cuBLAS sums in another order), 1e-1 under FP8 recipes (bias and
norm-parameter gradients are sums over 512 tokens of E5M2 values, measured up to 6.4% apart;
MXFP8 and NVFP4 included: their block scales re-quantize GEMM results too, and NVFP4's
stochastic rounding draws the same Philox bits on both backends); 1e-2 in bfloat16 (3e-2 with
Float8CurrentScaling and DelayedScaling); the next DelayedScaling state to 1e-3 (1e-2 in
bfloat16). Under FP8 the backends differ first by the H200's FP8 tensor-core rounding (~1e-4;
fast accumulation in fprop under Float8CurrentScaling and DelayedScaling, ~2e-3:
tests/gpu/test_gemm.py), then every value quantized again from a GEMM
result (FC2's input, the E5M2 gradient of a loss of y) lands one FP8 step (6-25%) apart where it
sat near a rounding boundary: measured 0.2-3.6% normwise on the H200 (2026-11-30), amaxes of GEMM
outputs 1.1e-4 apart. A scale, layout or copy error is an error near 1.

Run on the GPU machine:
  PYTHONPATH=packages/te-core/src:packages/te-jax/src pytest tests/gpu/test_jax_flax.py
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import te_jax
from _jax_devices import CPU, GPU, SKIP_WITHOUT_GPU
from te_jax import recipe
from te_jax.flax import DenseGeneral, LayerNormDenseGeneral, LayerNormMLP

pytestmark = SKIP_WITHOUT_GPU

RECIPES = {
    "hp": None,
    "current": recipe.Float8CurrentScaling(),
    "delayed": recipe.DelayedScaling(amax_history_len=8),
    # TE-JAX's accumulation: fast in every GEMM (te's keyword-only DelayedScaling fields)
    "delayed_fast": recipe.DelayedScaling(
        amax_history_len=8,
        fp8_gemm_dgrad=recipe.MMParams(use_split_accumulator=False),
        fp8_gemm_wgrad=recipe.MMParams(use_split_accumulator=False),
    ),
    "block": recipe.Float8BlockScaling(),
    "mxfp8": recipe.MXFP8BlockScaling(),
    "nvfp4": recipe.NVFP4BlockScaling(),  # stochastic rounding from the "sr_rng" stream
}


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def _run(model, r, x, device):
    """(loss, grads wrt params and x, next fp8_metas or None) of model on ``device``."""
    with jax.default_device(CPU), te_jax.autocast(enabled=r is not None, recipe=r):
        variables = nn.unbox(model.init(jax.random.PRNGKey(0), x))
    variables, x = jax.device_put((variables, x), device)
    with te_jax.autocast(enabled=r is not None, recipe=r):

        def loss(params, metas, x):
            v = {"params": params} if metas is None else {"params": params, "fp8_metas": metas}
            out = model.apply(v, x, rngs={"sr_rng": jax.random.PRNGKey(3)})
            y = out[0] if isinstance(out, tuple) else out
            return jnp.mean(jnp.sin(y.astype(jnp.float32)))

        step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
        value, (g_params, metas, g_x) = step(variables["params"], variables.get("fp8_metas"), x)
    return value, (g_params, g_x), metas


MODELS = {
    "dense": lambda: DenseGeneral(384),
    "ln_dense": lambda: LayerNormDenseGeneral(384, use_bias=True),
    "mlp_gelu": lambda: LayerNormMLP(intermediate_dim=512, use_bias=True),
    "mlp_swiglu": lambda: LayerNormMLP(
        intermediate_dim=512, activations=("silu", "linear"), layernorm_type="rmsnorm"
    ),
}
CASES = [(m, r) for m in MODELS for r in ("hp", "current", "delayed", "block")] + [
    ("mlp_gelu", "mxfp8"),
    ("mlp_gelu", "nvfp4"),
    ("mlp_gelu", "delayed_fast"),
]
# 21 tokens: te_jax pads the rows to 32 for the per-tensor and block FP8 GEMMs (te_jax/_token_pad.py).
ODD_TOKEN_CASES = [
    (m, f"{r}-21tok") for m in ("ln_dense", "mlp_gelu") for r in ("current", "delayed", "block")
]


@pytest.mark.parametrize("model_name,recipe_name", CASES + ODD_TOKEN_CASES)
def test_module_gpu_matches_cpu(model_name, recipe_name):
    r = RECIPES[recipe_name.removesuffix("-21tok")]
    lead = (3, 7) if recipe_name.endswith("-21tok") else (4, 128)
    with jax.default_device(CPU):
        x = jax.random.normal(jax.random.PRNGKey(1), (*lead, 256), jnp.float32)
    model = MODELS[model_name]()
    cpu = _run(model, r, x, CPU)
    gpu = _run(model, r, x, GPU)
    # The loss is a mean of sin(y) over ~1e5 elements, near 0 (1.7e-5 for "dense"): relative to it
    # fp32 GEMMs in another summation order already differ by 1e-5. Its terms are O(1), so the
    # bound is absolute; the gradients below carry the relative checks.
    assert abs(float(gpu[0]) - float(cpu[0])) <= (1e-6 if r is None else 1e-4)
    grad_tol = 5e-5 if r is None else 1e-1
    for c, g in zip(jax.tree_util.tree_leaves(cpu[1]), jax.tree_util.tree_leaves(gpu[1]), strict=True):
        assert rel(g, c) <= grad_tol, rel(g, c)
    if recipe_name.startswith("delayed"):
        for c, g in zip(jax.tree_util.tree_leaves(cpu[2]), jax.tree_util.tree_leaves(gpu[2]), strict=True):
            assert rel(g, c) <= 1e-3


def test_mlp_bfloat16_gpu_matches_cpu():
    with jax.default_device(CPU):
        x = jax.random.normal(jax.random.PRNGKey(2), (4, 128, 256), jnp.float32).astype(jnp.bfloat16)
    model = LayerNormMLP(intermediate_dim=512, dtype=jnp.bfloat16)
    # delayed: a bf16 gelu MLP, whose FC1 + gelu and FC2 dgrad + gelu backward are one te_gemm
    # call each (te_gemm_act_ffi); its next state's amaxes may sit a bf16 step (2^-8) apart
    for r in (None, RECIPES["current"], RECIPES["delayed"]):
        cpu = _run(model, r, x, CPU)
        gpu = _run(model, r, x, GPU)
        for c, g in zip(jax.tree_util.tree_leaves(cpu[1]), jax.tree_util.tree_leaves(gpu[1]), strict=True):
            assert rel(g, c) <= (1e-2 if r is None else 3e-2)
        if r is RECIPES["delayed"]:
            for c, g in zip(
                jax.tree_util.tree_leaves(cpu[2]), jax.tree_util.tree_leaves(gpu[2]), strict=True
            ):
                assert rel(g, c) <= 1e-2
