"""te.TransformerLayer forward+backward against the same layer in plain torch BF16, ms and ratios.

Problem (defaults: GPU.md's TransformerLayer row for Transformer Engine): hidden 4096, ffn 16384,
32 heads, sequence 2048, batch 2, [s, b, hidden] BF16 parameters and activations, causal
attention, dropout off. Rows:
  torch         pre-norm block in plain torch: nn.LayerNorm, nn.Linear (QKV), torch's
                scaled_dot_product_attention (causal), nn.Linear (projection) and the residual,
                then nn.LayerNorm, nn.Linear, gelu (tanh), nn.Linear and the residual (the 1.00x
                reference)
  torch_compile the same layer under torch.compile
  te_bf16       te.TransformerLayer outside te.autocast
  te_delayed    te.TransformerLayer under DelayedScaling (its amax/scale update included per step)
  te_current    under Float8CurrentScaling
  te_block      under Float8BlockScaling
A step is forward, backward(dy), gradients dropped; timed with CUDA events around the Python
calls (host overhead included, as GPU.md's TE figures), synced and back to back in interleaved
rounds (benchmarks/_variants.py, _rounds.py). TFLOP/s counts the GEMMs (6 * tokens * params of
QKV, projection, FC1, FC2) and the attention's two products (causal: half of 4 * b * s^2 * hidden
forward, times 3 for forward and backward). --json PATH writes every figure.

    PYTHONPATH=packages/te-core/src:packages/te-torch/src python3 benchmarks/transformer_layer.py
"""

from __future__ import annotations

import argparse
import sys

import te_core._C as C
import te_torch as te
import torch
import torch.nn.functional as F
from _variants import time_variants, write_json
from mlp import make_step

RECIPES = {
    "te_delayed": te.recipe.DelayedScaling,
    "te_current": te.recipe.Float8CurrentScaling,
    "te_block": te.recipe.Float8BlockScaling,
}


class TorchLayer(torch.nn.Module):
    """The plain-torch pre-norm layer on [s, b, hidden]."""

    def __init__(self, hidden: int, ffn: int, heads: int, device="cuda", dtype=torch.bfloat16) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(hidden, **kw)
        self.qkv = torch.nn.Linear(hidden, 3 * hidden, **kw)
        self.proj = torch.nn.Linear(hidden, hidden, **kw)
        self.ln2 = torch.nn.LayerNorm(hidden, **kw)
        self.fc1 = torch.nn.Linear(hidden, ffn, **kw)
        self.fc2 = torch.nn.Linear(ffn, hidden, **kw)

    def forward(self, x):
        s, b, hidden = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(s, b, self.heads, 3, hidden // self.heads).unbind(3)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))  # [b, heads, s, d]
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.permute(2, 0, 1, 3).reshape(s, b, hidden))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--ffn", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--warmup-ms", type=float, default=100.0, help="per row and round, after --warmup")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.hidden % args.heads:
        print(
            f"transformer_layer.py: --heads {args.heads} must divide --hidden {args.hidden}", file=sys.stderr
        )
        return 2
    if not torch.cuda.is_available() or not C.BUILT_WITH_CUDA:
        print(
            "benchmarks/transformer_layer.py: needs a CUDA GPU and a CUDA build of te-core "
            f"(torch.cuda.is_available()={torch.cuda.is_available()}, te_core built with CUDA="
            f"{C.BUILT_WITH_CUDA})",
            file=sys.stderr,
        )
        return 1
    torch.manual_seed(0)
    s, b, h, f, heads = args.seq, args.batch, args.hidden, args.ffn, args.heads
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}; TransformerLayer fwd+bwd, "
        f"seq {s} x batch {b}, hidden {h}, ffn {f}, {heads} heads, causal"
    )
    print(
        f"{'':4s} {'variant':14s} {'ms':>9s} {'TFLOP/s':>8s} {'vs torch':>8s} {'b2b ms':>9s} {'vs torch':>8s}"
    )
    tokens = s * b
    flops = 6.0 * tokens * (h * 3 * h + h * h + 2 * h * f) + 3 * 2.0 * b * s * s * h
    x = torch.randn(s, b, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(s, b, h, device="cuda", dtype=torch.bfloat16)

    def te_layer():
        return te.TransformerLayer(
            h, f, heads, hidden_dropout=0.0, attention_dropout=0.0, params_dtype=torch.bfloat16, device="cuda"
        )

    def build(module, rcp=None):
        return make_step(module, x, dy, rcp)

    variants = [("torch", lambda: build(TorchLayer(h, f, heads)))]
    if not args.no_compile:
        variants.append(("torch_compile", lambda: build(torch.compile(TorchLayer(h, f, heads)))))
    variants.append(("te_bf16", lambda: build(te_layer())))
    variants += [(name, lambda rcp=rcp: build(te_layer(), rcp())) for name, rcp in RECIPES.items()]
    info = {"seq": s, "batch": b, "hidden": h, "ffn": f, "heads": heads}
    results = time_variants(variants, info, flops, args, "    ")
    if args.json:
        write_json(args.json, args, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
