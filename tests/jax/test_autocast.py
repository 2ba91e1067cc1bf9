"""te_jax.autocast / fp8_autocast and MeshResource: what a region sets, nesting, the recipe the
Flax modules trace with, and the errors for misuse.

Run: PYTHONPATH=packages/te-core/src:packages/te-jax/src pytest tests/jax/test_autocast.py
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import te_jax
from te_jax import MeshResource, recipe


def test_regions_and_nesting():
    outside = te_jax.get_autocast_state()
    assert (outside.enabled, outside.recipe, outside.mesh_resource) == (False, None, None)
    mr = MeshResource(dp_resource="data", tp_resource="model")
    cur = recipe.Float8CurrentScaling()
    with te_jax.autocast() as default:
        assert default.enabled is False
        assert isinstance(default.recipe, recipe.DelayedScaling)  # TE JAX's default recipe
    with te_jax.autocast(enabled=True, recipe=cur, mesh_resource=mr):
        s = te_jax.get_autocast_state()
        assert s.enabled and s.recipe is cur and s.mesh_resource is mr
        with te_jax.autocast(enabled=False):
            inner = te_jax.get_autocast_state()
            assert not inner.enabled and inner.mesh_resource is mr  # mesh_resource inherited
        assert te_jax.get_autocast_state() is s
        with pytest.raises(RuntimeError, match="boom"):
            with te_jax.autocast(enabled=True, recipe=recipe.Float8BlockScaling()):
                raise RuntimeError("boom")
        assert te_jax.get_autocast_state() is s  # restored after an exception too
    assert te_jax.get_autocast_state() == outside


def test_fp8_autocast_alias_and_threads():
    r = recipe.Float8BlockScaling()
    seen = {}
    with te_jax.fp8_autocast(enabled=True, fp8_recipe=r, mesh_resource=MeshResource(dp_resource="d")):
        s = te_jax.get_autocast_state()
        assert s.enabled and s.recipe is r and s.mesh_resource.dp_resource == "d"
        t = threading.Thread(target=lambda: seen.setdefault("state", te_jax.get_autocast_state()))
        t.start()
        t.join()
    assert seen["state"].enabled is False  # a region is per thread


def test_mesh_resource():
    mr = MeshResource(dp_resource="data", fsdp_resource="fsdp", tp_resource="model")
    assert mr.batch_axes == ("data", "fsdp")
    assert MeshResource().batch_axes == ()
    with pytest.raises(TypeError, match="MeshResource.tp_resource: expected a mesh axis name"):
        MeshResource(tp_resource=1)


def test_errors():
    with pytest.raises(TypeError, match="enabled: expected True or False, got 1"):
        with te_jax.autocast(enabled=1):
            pass
    with pytest.raises(TypeError, match="recipe: expected a te_jax.recipe recipe"):
        with te_jax.autocast(enabled=True, recipe="fp8"):
            pass
    with pytest.raises(TypeError, match="mesh_resource: expected a te_jax.MeshResource or None, got dict"):
        with te_jax.autocast(enabled=True, mesh_resource={"dp_resource": "data"}):
            pass
    with pytest.raises(NotImplementedError, match="recipe: CustomRecipe is not supported by te_jax"):
        with te_jax.autocast(enabled=True, recipe=recipe.CustomRecipe(qfactory=lambda role: None)):
            pass


def test_modules_trace_the_region_recipe():
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 16, 64))
    model = te_jax.flax.DenseGeneral(32)
    variables = model.init(jax.random.PRNGKey(1), x)
    kernel, bias = variables["params"]["kernel"], variables["params"]["bias"]
    hp = model.apply(variables, x)
    np.testing.assert_array_equal(np.asarray(hp), np.asarray(te_jax.dense(x, kernel, bias)))
    cur = recipe.Float8CurrentScaling()
    with te_jax.autocast(enabled=True, recipe=cur):
        fp8 = model.apply(variables, x)
        with te_jax.autocast(enabled=False, recipe=cur):
            off = model.apply(variables, x)
    np.testing.assert_array_equal(np.asarray(fp8), np.asarray(te_jax.dense(x, kernel, bias, recipe=cur)))
    np.testing.assert_array_equal(np.asarray(off), np.asarray(hp))
    assert float(jnp.abs(fp8 - hp).max()) > 0  # quantized: not the high-precision numbers
