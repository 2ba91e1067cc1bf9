"""te_jax's ops and Flax modules on a mesh of 4 host devices (conftest.py sets
--xla_force_host_platform_device_count): data- and tensor-parallel runs give the unsharded
numbers, produce the expected output shardings, and never all-gather a sharded operand (the
compiled program is searched for all-gather ops).

Tolerances: split GEMM sums are added in another order, so results match the unsharded run to
fp32 rounding (normwise <= 1e-5), with the same dy (a fixed cotangent, so FP8 quantization of
the gradient sees the same values).

Run: PYTHONPATH=packages/te-core/src:packages/te-jax/src pytest tests/jax/test_sharding.py
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
import te_jax
from _refs import RECIPES, make_mlp, rel
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P
from te_jax import MeshResource

if len(jax.devices("cpu")) < 4:
    raise RuntimeError(
        "tests/jax/test_sharding.py needs 4 host devices: run it with "
        "XLA_FLAGS=--xla_force_host_platform_device_count=4 (tests/jax/conftest.py sets it unless "
        "jax started a backend before the conftest ran)"
    )

TOL = 1e-5
# (recipe, layout) pairs covering each recipe and each split: data parallel, column- and
# row-parallel (both also data parallel)
DENSE_CASES = [
    ("hp", "dp_row"),
    ("current", "dp"),
    ("current", "dp_row"),
    ("block", "dp_row"),
    ("delayed", "dp_col"),
    ("mxfp8", "dp_col"),
    ("nvfp4", "dp"),
]


def _mesh(types=AxisType.Explicit):
    return jax.make_mesh((2, 2), ("data", "model"), axis_types=(types, types))


def _recipe(name):
    return None if name == "hp" else RECIPES[name]


def _gathers(fn, *args) -> int:
    return fn.lower(*args).compile().as_text().count("all-gather(")


def _value_and_grads(f, args, dy):
    def run(*args):
        y, vjp = jax.vjp(f, *args)
        return y, vjp(dy)

    return jax.jit(run)


@pytest.mark.parametrize("name,layout", DENSE_CASES)
def test_dense(name, layout):
    r = _recipe(name)
    ks = jax.random.split(jax.random.PRNGKey(0), 4)
    x = jax.random.normal(ks[0], (4, 64, 256))
    w = jax.random.normal(ks[1], (256, 256)) / 16
    b = jax.random.normal(ks[2], (256,))
    dy = jax.random.normal(ks[3], (4, 64, 256))
    state = te_jax.init_recipe_state(r, "dense")
    x_spec, k_spec = {
        "dp": (P("data"), P()),
        "dp_col": (P("data"), P(None, "model")),
        "dp_row": (P("data", None, "model"), P("model", None)),
    }[layout]

    def op(x, w, b, st, **specs):
        return te_jax.dense(x, w, b, recipe=r, recipe_state=st, **specs)

    y0, g0 = _value_and_grads(op, (x, w, b, state), dy)(x, w, b, state)
    mesh = _mesh()
    with jax.set_mesh(mesh):
        xs = jax.device_put(x, NamedSharding(mesh, x_spec))
        fn = _value_and_grads(lambda *a: op(*a, input_spec=x_spec, kernel_spec=k_spec), (xs, w, b, state), dy)
        assert _gathers(fn, xs, w, b, state) == 0
        y, g = fn(xs, w, b, state)
    want_y = P("data", None, "model") if layout == "dp_col" else P("data", None, None)
    assert y.sharding.spec == want_y, y.sharding.spec
    assert g[0].sharding.spec == P(*x_spec, *([None] * (3 - len(x_spec))))
    assert g[1].sharding.spec == P(*k_spec, *([None] * (2 - len(k_spec))))
    assert rel(y, y0) <= TOL
    for a, c in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(g0), strict=True):
        assert rel(a, c) <= TOL or float(jnp.abs(c).max()) == 0


@pytest.mark.parametrize("name", ["current", "delayed"])
def test_dense_odd_tokens_are_padded_per_shard(name):
    # 21 rows per data shard: each shard pads its own rows to 32 (te_jax._token_pad), the
    # unsharded run its 42 to 48; same numbers, nothing gathered. (Float8BlockScaling keeps its
    # rule that a shard's rows come in runs of 128, so no block spans two devices.)
    r = _recipe(name)
    ks = jax.random.split(jax.random.PRNGKey(5), 3)
    x = jax.random.normal(ks[0], (2, 21, 256))
    w = jax.random.normal(ks[1], (256, 128)) / 16
    dy = jax.random.normal(ks[2], (2, 21, 128))
    state = te_jax.init_recipe_state(r, "dense")

    def op(x, w, st, **specs):
        return te_jax.dense(x, w, recipe=r, recipe_state=st, **specs)

    y0, g0 = _value_and_grads(op, (x, w, state), dy)(x, w, state)
    mesh = jax.make_mesh((2,), ("data",), axis_types=(AxisType.Explicit,), devices=jax.devices("cpu")[:2])
    with jax.set_mesh(mesh):
        xs = jax.device_put(x, NamedSharding(mesh, P("data")))
        fn = _value_and_grads(lambda *a: op(*a, input_spec=P("data")), (xs, w, state), dy)
        assert _gathers(fn, xs, w, state) == 0
        y, g = fn(xs, w, state)
    assert y.sharding.spec == P("data", None, None)
    assert rel(y, y0) <= TOL
    for a, c in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(g0), strict=True):
        assert rel(a, c) <= TOL or float(jnp.abs(c).max()) == 0


# delayed with plain gelu: the activation runs inside the GEMMs (te_gemm_act_ffi), its amax
# max-reduced over the tensor-parallel shards of F as well
@pytest.mark.parametrize(
    "name,acts",
    [
        ("hp", ("gelu", "linear")),
        ("current", ("gelu", "linear")),
        ("delayed", ("gelu", "linear")),
        ("delayed", ("gelu",)),
    ],
)
def test_layernorm_mlp_data_and_tensor_parallel(name, acts):
    r = _recipe(name)
    x, g, b, k1, b1, k2, b2, dy = make_mlp(b=4, s=64, h=128, f=256, acts=acts, seed=1)
    state = te_jax.init_recipe_state(r, "layernorm_mlp")
    args = (x, g, b, k1, b1, k2, b2, state)

    def op(*a, **specs):
        return te_jax.layernorm_mlp(*a[:7], activations=acts, recipe=r, recipe_state=a[7], **specs)[0]

    y0, g0 = _value_and_grads(op, args, dy)(*args)
    mesh = _mesh(AxisType.Auto)
    with jax.set_mesh(mesh):
        fn = _value_and_grads(
            lambda *a: op(*a, input_spec=P("data"), kernel_1_spec=P(None, None, "model")), args, dy
        )
        assert _gathers(fn, *args) == 0
        y, grads = fn(*args)
    assert y.sharding.spec == P("data")
    assert grads[3].sharding.spec == P(None, None, "model")  # dkernel_1 split on F like kernel_1
    assert grads[5].sharding.spec == P("model")  # dkernel_2 split on F
    assert rel(y, y0) <= TOL
    for a, c in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(g0), strict=True):
        assert rel(a, c) <= TOL or float(jnp.abs(c).max()) == 0
    if state is not None:  # the next state: amaxes reduced over every device, as unsharded
        for key in state:
            assert rel(grads[7][key], g0[7][key]) == 0.0, key


def test_layernorm_and_activation():
    x = jax.random.normal(jax.random.PRNGKey(2), (8, 16, 64))
    gamma, beta = jnp.ones(64) * 1.1, jnp.full(64, 0.1)
    mesh = _mesh()

    def both(x, gamma, beta):
        return jnp.sum(te_jax.activation(te_jax.layernorm(x, gamma, beta), ("gelu",)) * x)

    g0 = jax.grad(both, argnums=(0, 1, 2))(x, gamma, beta)
    with jax.set_mesh(mesh), te_jax.autocast(mesh_resource=MeshResource(dp_resource="data")):
        xs = jax.device_put(x, NamedSharding(mesh, P("data")))
        fn = jax.jit(jax.grad(both, argnums=(0, 1, 2)))
        assert _gathers(fn, xs, gamma, beta) == 0
        g = fn(xs, gamma, beta)
    assert g[0].sharding.spec == P("data", None, None)
    for a, c in zip(g, g0, strict=True):
        assert rel(a, c) <= TOL


class _Model(nn.Module):
    @nn.compact
    def __call__(self, x):
        y, _ = te_jax.flax.LayerNormMLP(intermediate_dim=256, activations=("silu", "linear"), use_bias=True)(
            x
        )
        return te_jax.flax.DenseGeneral(64, kernel_axes=("embed", "mlp"))(y)


def test_flax_modules_with_mesh_resource():
    # logical axes -> splits: "batch" over dp, "mlp" over tp (te_jax's rules from MeshResource)
    r = RECIPES["current"]
    x = jax.random.normal(jax.random.PRNGKey(3), (4, 32, 128))
    model = _Model()
    mr = MeshResource(dp_resource="data", tp_resource="model")

    def train_step(params, x):
        return jax.value_and_grad(lambda p: jnp.mean(model.apply({"params": p}, x) ** 2))(params)

    with te_jax.autocast(enabled=True, recipe=r):
        boxed = model.init(jax.random.PRNGKey(0), x)
        params = nn.unbox(boxed)["params"]
        l0, g0 = jax.jit(train_step)(params, x)
    mesh = _mesh(AxisType.Auto)
    with jax.set_mesh(mesh), te_jax.autocast(enabled=True, recipe=r, mesh_resource=mr):
        rules = [("mlp", "model")]
        shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed), mesh, rules)["params"]
        placed = jax.device_put(params, shardings)
        xs = jax.device_put(x, NamedSharding(mesh, P("data")))
        fn = jax.jit(train_step)
        assert _gathers(fn, placed, xs) == 0
        loss, g = fn(placed, xs)
    assert placed["LayerNormMLP_0"]["wi_kernel"].sharding.spec == P(None, None, "model")
    assert g["LayerNormMLP_0"]["wi_kernel"].sharding.spec == P(None, None, "model")
    assert rel(loss, l0) <= TOL
    for a, c in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(g0), strict=True):
        assert rel(a, c) <= TOL or float(jnp.abs(c).max()) == 0


def test_fsdp_weights_are_gathered_for_the_gemm():
    # kernel stored split over "data" (its "embed" rows), activations split over "data" too
    x = jax.random.normal(jax.random.PRNGKey(4), (4, 16, 64))
    model = te_jax.flax.DenseGeneral(32, kernel_axes=("embed", "mlp"))
    params = nn.unbox(model.init(jax.random.PRNGKey(0), x))

    def loss(p, x):
        return jnp.sum(jnp.cos(model.apply(p, x)))

    g0 = jax.grad(loss, argnums=(0, 1))(params, x)
    mesh = _mesh(AxisType.Auto)
    rules = [("embed", "data"), ("mlp", "model")]
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        with te_jax.autocast(mesh_resource=MeshResource(fsdp_resource="data", tp_resource="model")):
            specs = nn.get_partition_spec(model.init(jax.random.PRNGKey(0), x))
            placed = jax.device_put(params, nn.logical_to_mesh_sharding(specs, mesh, rules))
            g = jax.jit(jax.grad(loss, argnums=(0, 1)))(
                placed, jax.device_put(x, NamedSharding(mesh, P("data")))
            )
    assert placed["params"]["kernel"].sharding.spec == P("data", "model")
    for a, c in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(g0), strict=True):
        assert rel(a, c) <= TOL


def test_mesh_resource_batch_axis_missing_from_the_mesh_is_an_error():
    # a misspelt dp_resource used to run the op replicated, warning that no MeshResource was set
    x = jnp.ones((4, 16, 64))
    for mr in (MeshResource(dp_resource="dp"), MeshResource(dp_resource="data", fsdp_resource="fsdp")):
        field = "fsdp_resource" if mr.fsdp_resource else "dp_resource"
        with (
            jax.set_mesh(_mesh()),
            te_jax.autocast(enabled=True, recipe=RECIPES["current"], mesh_resource=mr),
        ):
            model = te_jax.flax.DenseGeneral(32)
            with pytest.raises(
                ValueError, match=rf"MeshResource.{field}: axis '\w+' is not in the mesh's axes"
            ):
                model.init(jax.random.PRNGKey(0), x)


def test_errors():
    x = jnp.ones((4, 64, 256))
    w = jnp.ones((256, 256))
    with pytest.raises(ValueError, match="input_spec: P.'data',. names mesh axes but no mesh is set"):
        te_jax.dense(x, w, input_spec=P("data"))
    with jax.set_mesh(_mesh()):
        with pytest.raises(
            ValueError, match=r"input_spec: axis 'batch' of P\('batch',\) is not in the mesh's axes"
        ):
            te_jax.dense(x, w, input_spec=P("batch"))
        with pytest.raises(
            ValueError, match=r"input_spec: dim 0 \(size 3\) is split over mesh axes \('data',\)"
        ):
            te_jax.dense(jnp.ones((3, 64, 256)), w, input_spec=P("data"))
        with pytest.raises(
            ValueError, match="kernel_spec: its first .K. entry None must split K as input_spec's last"
        ):
            te_jax.dense(x, w, input_spec=P("data", None, "model"), kernel_spec=P(None, None))
        with pytest.raises(ValueError, match="kernel_spec: mesh axes \\['data'\\] split both the kernel and"):
            te_jax.dense(x, w, input_spec=P("data"), kernel_spec=P(None, "data"))
        with pytest.raises(
            ValueError, match="Float8BlockScaling needs a multiple of 128 so blocks stay on one device"
        ):
            te_jax.dense(jnp.ones((4, 16, 256)), w, input_spec=P("data"), recipe=RECIPES["block"])
        with pytest.raises(ValueError, match="input_spec: the normalized dim H may not be split"):
            te_jax.layernorm_dense(
                x, jnp.ones(256), None, w, layernorm_type="rmsnorm", input_spec=P("data", None, "model")
            )
        with pytest.raises(ValueError, match="kernel_1_spec: only F .the last entry. may be split"):
            te_jax.layernorm_mlp(
                x, jnp.ones(256), None, jnp.ones((256, 1, 128)), None, jnp.ones((128, 256)), None,
                layernorm_type="rmsnorm", kernel_1_spec=P("model"),
            )  # fmt: skip
