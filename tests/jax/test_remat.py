"""te_jax modules under Flax's nn.remat (activation recomputation, JAX's counterpart of
te.checkpoint): the loss, every gradient and the next DelayedScaling state equal the plain
module's bit for bit under each recipe. The scaling state is an explicit input of the step, so
the recomputation quantizes with the forward's scales and its amaxes are the forward's."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import te_jax
from te_jax import recipe
from te_jax.flax import DenseGeneral, LayerNormMLP

RECIPES = {
    "delayed": lambda: recipe.DelayedScaling(amax_history_len=4),
    "current": recipe.Float8CurrentScaling,
    "block": recipe.Float8BlockScaling,
}
MODULES = {
    "dense": (DenseGeneral, {"features": 128}),
    "mlp": (LayerNormMLP, {"intermediate_dim": 256, "activations": ("silu", "linear")}),
}


@pytest.mark.parametrize("mname", list(MODULES))
@pytest.mark.parametrize("rname", list(RECIPES))
def test_remat_matches_the_plain_module(mname, rname):
    cls, kw = MODULES[mname]
    r = RECIPES[rname]()
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 32, 128), jnp.float32)
    with te_jax.autocast(enabled=True, recipe=r):
        plain, remat = cls(**kw), nn.remat(cls)(**kw)
        variables = nn.unbox(plain.init(jax.random.PRNGKey(0), x))

        def step(model):
            def loss(params, metas, x):
                v = {"params": params} if metas is None else {"params": params, "fp8_metas": metas}
                out = model.apply(v, x)
                y = out[0] if isinstance(out, tuple) else out
                return jnp.mean(jnp.sin(y.astype(jnp.float32)))

            return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(
                variables["params"], variables.get("fp8_metas"), x
            )

        want, got = step(plain), step(remat)
    leaves_w, leaves_g = jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got)
    assert len(leaves_w) == len(leaves_g) > 3
    for w, g in zip(leaves_w, leaves_g, strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    if rname == "delayed":  # the next state came out of the step (amax histories updated)
        metas = jax.tree_util.tree_leaves(got[1][1])
        assert any(np.asarray(m).any() for m in metas)
