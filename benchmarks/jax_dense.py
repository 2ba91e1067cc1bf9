"""te_jax's LayerNormMLP forward+backward under jit: FP8 (delayed, current, block scaling) and
BF16 against plain Flax BF16 (nn.LayerNorm + nn.Dense + gelu + nn.Dense), in one run.

Problem (TE's JAX figure in shared/GPU.md): hidden 4096, ffn 16384, 16384 tokens (8 x 2048),
gelu (tanh), no biases, BF16 parameters and activations. One step is the jitted forward and
backward of the layer with a fixed output gradient: gradients of every parameter and of the
input (plus the next fp8_metas state under DelayedScaling). Timing, two ways, on the host clock:
synced (each step waited for with block_until_ready: its latency, the host's dispatch included)
and back to back (--b2b steps dispatched, then the last waited for: a training loop's throughput,
where the host enqueues a step while the GPU runs the previous one). Rows run in --rounds
interleaved rounds (benchmarks/_rounds.py: the GPU's clocks drift with its heat, so a row's ratio
is the median of its per-round ratios to plain Flax's row of the same round; rows in a seeded
shuffle after the first round), each round --warmup steps and timed steps, discarded, for at least
--warmup-ms, then the median of --iters; ms is the median over rounds. TFLOP/s count the six
GEMMs (12 * tokens * hidden * ffn). Before timing, each variant's output is checked against
plain Flax BF16 (normwise relative error; FP8 within 0.1, BF16 within 0.02), so a broken
variant cannot post a time. Target: the best FP8 variant >= 1.8x plain Flax BF16 (synced or
back to back) under te's default numerics. te_fp8_delayed_fast (DelayedScaling with fast
accumulation in all three GEMMs) does not count: it is TE-JAX's setting (its gemm() takes
FP8_2X_ACC_FPROP for every GEMM) against te's split accumulation in dgrad and wgrad
(NUMERICS.md), and shows what that choice is worth. --inference times the jitted forward
alone, no jax.grad (prefill; TFLOP/s then count the two GEMMs, 4 * tokens * hidden * ffn; no
target).
--json PATH writes every figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from _rounds import interleaved, ratio

TARGET = 1.8
BF16 = jnp.bfloat16
# Fast accumulation in all three GEMMs (TE-JAX's setting; te's default splits dgrad and wgrad).
NOT_COUNTED = {"te_fp8_delayed_fast"}


class FlaxMLP(nn.Module):
    """The plain Flax layer te_jax.flax.LayerNormMLP replaces."""

    ffn: int

    @nn.compact
    def __call__(self, x):
        h = x.shape[-1]
        y = nn.LayerNorm(epsilon=1e-6, dtype=BF16, param_dtype=BF16)(x)
        y = nn.Dense(self.ffn, use_bias=False, dtype=BF16, param_dtype=BF16)(y)
        y = jax.nn.gelu(y, approximate=True)
        return nn.Dense(h, use_bias=False, dtype=BF16, param_dtype=BF16)(y)


def _te_params(flax_params, hidden: int, ffn: int) -> dict:
    """te_jax.flax.LayerNormMLP's parameters holding plain Flax's values (same numbers)."""
    return {
        "scale": flax_params["LayerNorm_0"]["scale"],
        "ln_bias": flax_params["LayerNorm_0"]["bias"],
        "wi_kernel": flax_params["Dense_0"]["kernel"].reshape(hidden, 1, ffn),
        "wo_kernel": flax_params["Dense_1"]["kernel"],
    }


def _step(model, recipe, x, dy, params, inference=False):
    """(jitted step, its arguments) for ``model`` under ``recipe`` (None: high precision); the step
    returns (y, the vjp's cotangents), or with ``inference`` (y, None) from the forward alone."""
    import te_jax

    with te_jax.autocast(enabled=recipe is not None, recipe=recipe):
        metas = nn.unbox(model.init(jax.random.PRNGKey(0), x)).get("fp8_metas")

        def fwd_bwd(params, metas, x):
            def f(params, metas, x):
                v = {"params": params} if metas is None else {"params": params, "fp8_metas": metas}
                out = model.apply(v, x)
                return out[0] if isinstance(out, tuple) else out

            if inference:
                return f(params, metas, x), None
            y, vjp = jax.vjp(f, params, metas, x)
            return y, vjp(dy)

        # traced and compiled inside the region: the compiled step keeps its recipe
        step = jax.jit(fwd_bwd).lower(params, metas, x).compile()
    return step, (params, metas, x)


def _host_ms(fn) -> float:
    """One call of fn, waited for, on the host clock (jit: one executable per step)."""
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    return (time.perf_counter() - t0) * 1e3


def _b2b_ms(fn, steps: int) -> float:
    """``steps`` calls of fn dispatched back to back, the last waited for; ms per call."""
    t0 = time.perf_counter()
    for _ in range(steps - 1):
        fn()
    jax.block_until_ready(fn())
    return (time.perf_counter() - t0) * 1e3 / steps


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--ffn", type=int, default=16384)
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--warmup-ms", type=float, default=100.0, help="per row and round, after --warmup")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--b2b", type=int, default=5, help="steps per back-to-back sample")
    ap.add_argument("--inference", action="store_true", help="the forward alone, no jax.grad")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.b2b < 1:
        ap.error(f"--b2b: expected a step count >= 1, got {args.b2b}")
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError:
        print(
            "benchmarks/jax_dense.py: needs a GPU visible to jax (jax with its CUDA plugin)", file=sys.stderr
        )
        return 1
    import te_jax
    from te_core import _C

    if not _C.BUILT_WITH_CUDA:
        print("benchmarks/jax_dense.py: needs a CUDA build of te-core (TE_CUDA_ARCHS=90a)", file=sys.stderr)
        return 1
    from te_jax import recipe

    all_fast = {
        f"fp8_gemm_{g}": recipe.MMParams(use_split_accumulator=False) for g in ("fprop", "dgrad", "wgrad")
    }

    seq = 2048 if args.tokens % 2048 == 0 else args.tokens
    shape = (args.tokens // seq, seq, args.hidden)
    with jax.default_device(gpu):
        x = jax.random.normal(jax.random.PRNGKey(1), shape, jnp.float32).astype(BF16)
        dy = jax.random.normal(jax.random.PRNGKey(2), shape, jnp.float32).astype(BF16)
        te_mlp = te_jax.flax.LayerNormMLP(intermediate_dim=args.ffn, activations=("gelu",), dtype=BF16)
        variants = [
            ("flax_bf16", FlaxMLP(args.ffn), None),
            ("te_bf16", te_mlp, None),
            ("te_fp8_delayed", te_mlp, recipe.DelayedScaling()),
            ("te_fp8_current", te_mlp, recipe.Float8CurrentScaling()),
            ("te_fp8_block", te_mlp, recipe.Float8BlockScaling()),
            ("te_fp8_delayed_fast", te_mlp, recipe.DelayedScaling(**all_fast)),
        ]
        flax_params = nn.unbox(FlaxMLP(args.ffn).init(jax.random.PRNGKey(0), x))["params"]
        te_params = _te_params(flax_params, args.hidden, args.ffn)
        flops = (4.0 if args.inference else 12.0) * args.tokens * args.hidden * args.ffn
        what = "forward (no jax.grad)" if args.inference else "forward+backward"
        problem = f"LayerNormMLP {args.hidden}/{args.ffn} {what}, {args.tokens} tokens"
        print(f"{gpu.device_kind}, jax {jax.__version__}; {problem}")
        print(
            f"{'variant':19s} {'ms':>9s} {'TFLOP/s':>8s} {'vs flax':>8s} {'b2b ms':>9s} {'vs flax':>8s}"
            f" {'rel err':>8s}"
        )
        results, y_flax, steps = [], None, {}
        for name, model, r in variants:
            entry = {"variant": name}
            results.append(entry)
            try:
                step, step_args = _step(
                    model, r, x, dy, flax_params if name == "flax_bf16" else te_params, args.inference
                )
                if r is not None and r.delayed():
                    # three training steps calibrate the scales (an inference run starts from them)
                    train = step if not args.inference else _step(model, r, x, dy, te_params)[0]
                    for _ in range(3):
                        _, (_, metas, _) = train(*step_args)
                        step_args = (step_args[0], metas, step_args[2])
                y, _ = jax.block_until_ready(step(*step_args))
                if y_flax is None:
                    y_flax = y
                err = _rel(y, y_flax)
                limit = 0.1 if r is not None else 0.02
                entry["rel_err_vs_flax"] = err
                if not err <= limit:
                    raise RuntimeError(f"output differs from plain Flax BF16: rel err {err:.3g} > {limit}")
                steps[name] = lambda step=step, step_args=step_args: step(*step_args)
            except Exception as e:  # noqa: BLE001 (report every variant; one failure does not hide the rest)
                entry["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        per, failed = interleaved(steps, _host_ms, args.rounds, args.iters, args.warmup, args.warmup_ms)
        per_b2b, failed_b2b = interleaved(
            steps, lambda fn: _b2b_ms(fn, args.b2b), args.rounds, args.iters, args.warmup, args.warmup_ms
        )
        for name, e in failed_b2b.items():
            failed.setdefault(name, e)
        for entry in results:
            name = entry["variant"]
            if name in failed:
                entry["error"] = f"{type(failed[name]).__name__}: {str(failed[name])[:300]}"
            if "error" in entry or not per.get(name):
                print(f"{name:19s} FAILED: {entry.get('error', 'no round completed')}", flush=True)
                continue
            ms = statistics.median(per[name])
            entry.update(ms=ms, ms_rounds=per[name], tflops=flops / ms / 1e9)
            entry["speedup_vs_flax_bf16"] = ratio(per, "flax_bf16", name)
            b2b = statistics.median(per_b2b[name])
            entry.update(b2b_ms=b2b, b2b_ms_rounds=per_b2b[name])
            entry["b2b_speedup_vs_flax_bf16"] = ratio(per_b2b, "flax_bf16", name)

            def shown(r):
                return f"{r:7.2f}x" if r else "      -"

            err = entry["rel_err_vs_flax"]
            print(
                f"{name:19s} {ms:9.3f} {entry['tflops']:8.1f} {shown(entry['speedup_vs_flax_bf16'])} "
                f"{b2b:9.3f} {shown(entry['b2b_speedup_vs_flax_bf16'])} {err:8.2e}",
                flush=True,
            )
    fp8 = [
        max(e["speedup_vs_flax_bf16"], e.get("b2b_speedup_vs_flax_bf16") or 0.0)
        for e in results
        if e["variant"].startswith("te_fp8")
        and e["variant"] not in NOT_COUNTED
        and e.get("speedup_vs_flax_bf16")
    ]
    best = max(fp8) if fp8 else None
    verdict = "n/a" if best is None or args.inference else ("PASS" if best >= TARGET else "FAIL")
    print(
        f"target: best FP8 >= {TARGET}x plain Flax BF16 (training): "
        f"{'-' if best is None else f'{best:.2f}x'} {verdict}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "device": gpu.device_kind,
                    "jax": jax.__version__,
                    "problem": {
                        "tokens": args.tokens,
                        "hidden": args.hidden,
                        "ffn": args.ffn,
                        "activation": "gelu",
                    },
                    "iters": args.iters,
                    "warmup": args.warmup,
                    "warmup_ms": args.warmup_ms,
                    "rounds": args.rounds,
                    "b2b_steps": args.b2b,
                    "inference": args.inference,
                    "target_speedup": TARGET,
                    "best_fp8_speedup": best,
                    "results": results,
                },
                f,
                indent=2,
            )
    return 0 if all("error" not in e for e in results) else 1


if __name__ == "__main__":
    sys.exit(main())
