"""te.LayerNormMLP forward+backward against the same block in plain torch BF16, ms and ratios.

Problem (defaults): 16384 tokens, hidden 4096, ffn 16384, BF16 parameters and activations, with
gelu (tanh) and swiglu (FC1 twice as wide). For each activation:
  torch         nn.LayerNorm + nn.Linear + activation + nn.Linear, eager (the 1.00x reference)
  torch_compile the same block under torch.compile (inductor)
  te_bf16       te.LayerNormMLP outside te.autocast (te's norm / activation kernels, torch GEMMs)
  te_delayed    te.LayerNormMLP under DelayedScaling (its amax/scale update included per step)
  te_current    under Float8CurrentScaling
  te_block      under Float8BlockScaling (1x128 inputs and grads, 128x128 weights)
A step is forward, backward(dy), gradients dropped (set_to_none); timed with CUDA events around
the Python calls, so host overhead counts (as GPU.md's TE figures), two ways: "synced", one step
between the events and waited for (every step also pays the host's time to its first kernel),
and "back to back", 5 steps between the events (a training loop's throughput: the host enqueues
a step while the GPU runs the previous one). Rows are timed in --rounds interleaved rounds
(benchmarks/_rounds.py: the GPU's clocks drift with its heat, so a row's ratio is the median of
per-round ratios to torch's row of the same round; rows in a seeded shuffle after the first
round); each round runs --warmup steps and timed steps, discarded, for at least --warmup-ms, then
takes the median of --iters synced steps (one back-to-back group). ms is the median over rounds;
TFLOP/s (synced) counts the three GEMMs of each layer forward and backward (6 * tokens * params
of FC1 and FC2). A variant that fails reports its error and the run goes on. --json PATH writes
every figure. --inference times the forward alone under torch.no_grad() (prefill; TFLOP/s then
counts 2 * tokens * params).

    PYTHONPATH=packages/te-core/src:packages/te-torch/src python3 benchmarks/mlp.py --json out.json
"""

from __future__ import annotations

import argparse
import sys

import te_core._C as C
import te_torch as te
import torch
import torch.nn.functional as F
from _variants import time_variants, write_json

RECIPES = {
    "te_delayed": te.recipe.DelayedScaling,
    "te_current": te.recipe.Float8CurrentScaling,
    "te_block": te.recipe.Float8BlockScaling,
}


class TorchMLP(torch.nn.Module):
    """The plain-torch block: LayerNorm -> Linear -> gelu(tanh) / swiglu -> Linear."""

    def __init__(self, hidden: int, ffn: int, act: str) -> None:
        super().__init__()
        self.act = act
        fc1_out = 2 * ffn if act == "swiglu" else ffn
        kw = {"device": "cuda", "dtype": torch.bfloat16}
        self.ln = torch.nn.LayerNorm(hidden, **kw)
        self.fc1 = torch.nn.Linear(hidden, fc1_out, **kw)
        self.fc2 = torch.nn.Linear(ffn, hidden, **kw)

    def forward(self, x):
        h = self.fc1(self.ln(x))
        if self.act == "swiglu":
            a, gate = h.chunk(2, dim=-1)
            h = F.silu(a) * gate
        else:
            h = F.gelu(h, approximate="tanh")
        return self.fc2(h)


def make_step(module, x, dy, recipe=None, inference=False):
    def step():
        with torch.set_grad_enabled(not inference):
            if recipe is None:
                y = module(x)
            else:
                with te.autocast(recipe=recipe):
                    y = module(x)
        if inference:
            return
        y.backward(dy)
        module.zero_grad(set_to_none=True)
        x.grad = None

    return step


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--ffn", type=int, default=16384)
    ap.add_argument("--activations", default="gelu,swiglu")
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--warmup-ms", type=float, default=100.0, help="per row and round, after --warmup")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    ap.add_argument("--inference", action="store_true", help="forward only, under torch.no_grad()")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available() or not C.BUILT_WITH_CUDA:
        print(
            "benchmarks/mlp.py: needs a CUDA GPU and a CUDA build of te-core "
            f"(torch.cuda.is_available()={torch.cuda.is_available()}, te_core built with CUDA="
            f"{C.BUILT_WITH_CUDA})",
            file=sys.stderr,
        )
        return 1
    torch.manual_seed(0)
    t, h, f = args.tokens, args.hidden, args.ffn
    gpu = torch.cuda.get_device_name()
    what = "fwd (no_grad)" if args.inference else "fwd+bwd"
    print(f"{gpu}, torch {torch.__version__}; LayerNormMLP {what}, {t} tokens, {h} -> {f} -> {h}")
    print(
        f"{'activation':10s} {'variant':14s} {'ms':>9s} {'TFLOP/s':>8s} {'vs torch':>8s}"
        f" {'b2b ms':>9s} {'vs torch':>8s}"
    )
    results = []
    for act in args.activations.split(","):
        fc1_out = 2 * f if act == "swiglu" else f
        flops = (2.0 if args.inference else 6.0) * t * (h * fc1_out + f * h)
        x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)

        def te_mlp(act=act):
            return te.LayerNormMLP(h, f, activation=act, params_dtype=torch.bfloat16, device="cuda")

        def build(module, rcp=None, x=x, dy=dy):
            return make_step(module, x, dy, rcp, args.inference)

        variants = [("torch", lambda act=act: build(TorchMLP(h, f, act)))]
        if not args.no_compile:
            variants.append(("torch_compile", lambda act=act: build(torch.compile(TorchMLP(h, f, act)))))
        variants.append(("te_bf16", lambda mk=te_mlp: build(mk())))
        variants += [(name, lambda mk=te_mlp, rcp=rcp: build(mk(), rcp())) for name, rcp in RECIPES.items()]
        info = {"activation": act, "tokens": t, "hidden": h, "ffn": f}
        results += time_variants(variants, info, flops, args, f"{act:10s}")
        del x, dy
        torch.cuda.empty_cache()
    if args.json:
        write_json(args.json, args, results, inference=args.inference)
    return 0


if __name__ == "__main__":
    sys.exit(main())
