"""Train a small Transformer-style MLP stack with te_jax.flax under each recipe and compare.

The model: ``layers`` pre-norm residual blocks ``x + LayerNormMLP(x)`` and a final
LayerNormDenseGeneral head. The task (synthetic, so the example needs no download): regress the
outputs of a fixed random "teacher" network of the same shape on random token vectors. Every
recipe trains from the same initial parameters on the same batches, with AdamW; the table shows
the loss along the way and the time per step. Runs on a GPU when jax sees one, otherwise on
te's CPU backend (same numbers; MXFP8 and NVFP4 GEMMs run by BF16 block dequantization everywhere).

    nox -s jax_example     # or: python examples/flax_mlp.py [--steps 60 --recipes bf16,delayed]
    python examples/flax_mlp.py --data-parallel 4   # the batch split over 4 (host) devices

The training step shows DelayedScaling's state handling: the "fp8_metas" collection goes into
``apply`` with the params, and ``jax.grad`` with respect to it returns the next state.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def _parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--ffn", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--recipes", default="high_precision,delayed,current,block,mxfp8,nvfp4")
    p.add_argument("--data-parallel", type=int, default=1, help="split the batch over this many devices")
    return p.parse_args()


ARGS = _parse()
if ARGS.data_parallel > 1 and "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    # on a CPU-only machine, give XLA enough host devices (read when jax starts its backend)
    os.environ["XLA_FLAGS"] = (
        f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={ARGS.data_parallel}"
    )

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
import te_jax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from te_jax import recipe  # noqa: E402
from te_jax.flax import LayerNormDenseGeneral, LayerNormMLP  # noqa: E402

RECIPES = {
    "high_precision": None,
    "delayed": recipe.DelayedScaling(amax_history_len=16),
    "current": recipe.Float8CurrentScaling(),
    "block": recipe.Float8BlockScaling(),
    "mxfp8": recipe.MXFP8BlockScaling(),
    "nvfp4": recipe.NVFP4BlockScaling(disable_stochastic_rounding=True),
}


class MLPStack(nn.Module):
    layers: int
    ffn: int

    @nn.compact
    def __call__(self, x):
        for _ in range(self.layers):
            y, _ = LayerNormMLP(intermediate_dim=self.ffn, activations=("gelu", "linear"))(x)
            x = x + y
        out, _ = LayerNormDenseGeneral(x.shape[-1])(x)
        return out


def batches(key, n: int, shape, teacher, teacher_params):
    """n (input, target) batches: random tokens and the teacher's outputs on them."""
    for k in jax.random.split(key, n):
        x = jax.random.normal(k, shape)
        yield x, teacher.apply(teacher_params, x)


def train(name: str, r, model, params0, data, mesh) -> tuple[list[float], float]:
    """Losses per step and seconds per step (after the first, which compiles)."""
    opt = optax.adamw(ARGS.lr, weight_decay=0.01)
    mr = te_jax.MeshResource(dp_resource="data") if mesh is not None else None
    with te_jax.autocast(enabled=r is not None, recipe=r, mesh_resource=mr):
        # DelayedScaling state lives beside the params; other recipes keep none
        metas = model.init(jax.random.PRNGKey(0), data[0][0]).get("fp8_metas")

        @jax.jit
        def step(params, metas, opt_state, x, y):
            def loss_fn(params, metas):
                v = {"params": params} if metas is None else {"params": params, "fp8_metas": metas}
                return jnp.mean((model.apply(v, x, rngs={"sr_rng": jax.random.PRNGKey(0)}) - y) ** 2)

            loss, (grads, new_metas) = jax.value_and_grad(loss_fn, argnums=(0, 1))(params, metas)
            updates, opt_state = opt.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), new_metas, opt_state, loss

        params, opt_state, losses = params0, opt.init(params0), []
        t0 = None
        for i, (x, y) in enumerate(data):
            if mesh is not None:
                x, y = (jax.device_put(a, NamedSharding(mesh, P("data"))) for a in (x, y))
            params, metas, opt_state, loss = step(params, metas, opt_state, x, y)
            losses.append(float(loss))
            if i == 0:
                t0 = time.perf_counter()
    per_step = (time.perf_counter() - t0) / max(1, len(data) - 1)
    return losses, per_step


def main() -> int:
    names = [n for n in ARGS.recipes.split(",") if n]
    unknown = [n for n in names if n not in RECIPES]
    if unknown:
        print(f"--recipes: unknown {unknown}; expected names from {list(RECIPES)}", file=sys.stderr)
        return 2
    device = jax.devices()[0]
    mesh = None
    if ARGS.data_parallel > 1:
        if len(jax.devices()) < ARGS.data_parallel or ARGS.batch % ARGS.data_parallel:
            print(
                f"--data-parallel {ARGS.data_parallel}: needs that many devices and a batch divisible by it",
                file=sys.stderr,
            )
            return 2
        mesh = jax.make_mesh((ARGS.data_parallel,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    shape = (ARGS.batch, ARGS.seq, ARGS.hidden)
    model = MLPStack(ARGS.layers, ARGS.ffn)
    teacher = MLPStack(ARGS.layers, ARGS.ffn)
    teacher_params = teacher.init(jax.random.PRNGKey(42), jnp.zeros(shape))
    data = list(batches(jax.random.PRNGKey(7), ARGS.steps, shape, teacher, teacher_params))
    params0 = nn.unbox(model.init(jax.random.PRNGKey(0), data[0][0])["params"])
    where = f"{device.platform} ({device.device_kind})" + (
        f", batch split over {ARGS.data_parallel}" if mesh else ""
    )
    print(f"MLP stack: {ARGS.layers} x LayerNormMLP {ARGS.hidden}/{ARGS.ffn} (GeGLU) + head; {where}")
    marks = sorted({0, ARGS.steps // 4, ARGS.steps // 2, ARGS.steps - 1})
    print(f"{'recipe':15s} " + " ".join(f"{'step ' + str(m):>10s}" for m in marks) + f" {'ms/step':>9s}")
    context = jax.set_mesh(mesh) if mesh is not None else _null()
    with context:
        for name in names:
            losses, per_step = train(name, RECIPES[name], model, params0, data, mesh)
            print(
                f"{name:15s} " + " ".join(f"{losses[m]:10.5f}" for m in marks) + f" {per_step * 1e3:9.1f}",
                flush=True,
            )
    return 0


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    sys.exit(main())
