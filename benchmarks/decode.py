"""One decode step of a te.TransformerLayer stack with a KV cache (te.InferenceParams) against the
same stack in plain torch with a static cache, ms per step and ratios.

Problem (defaults: a Llama-like block): 4 layers of hidden 4096, ffn 16384, 32 query heads over 8
key/value groups, batch 8, every sequence continuing one token a step from a 1024-token context,
BF16 parameters and activations, [b, 1, hidden] inputs, no dropout, no rotary embedding. Rows:
  torch       pre-norm layers in plain torch: nn.LayerNorm, nn.Linear (QKV), the new key and
              value written into a static [b, max, g, d] cache at the step's position (one
              length for the whole batch, so no mask), torch's scaled_dot_product_attention over
              the filled positions with enable_gqa, nn.Linear (projection), the MLP with gelu
              (tanh) (the 1.00x reference); attention by FlashAttention or the memory-efficient
              kernel (as te's cached attention: torch's cuDNN attention builds a plan per key
              length, so every decode step)
  torch_any   the same with torch's own choice of attention kernel
  te_bf16     te.TransformerLayer with te.InferenceParams (non-paged): pre_step and the layers
  te_paged    the same with a paged cache (pages of 64 positions)
  te_current  te_bf16 under Float8CurrentScaling (FP8 GEMMs)
  te_ragged   te_bf16 with sequence i's context 1024 + 8 i: each sequence its own length (the
              cache write by indices and a padding mask a step, which the other te rows,
              all sequences at one length, do without)
te's rows pay for what the torch row does not do: batch changes, paging, and (te_ragged) each
sequence's own length. When a cache fills, its lengths go back to the
context (host bookkeeping only; the cache's contents are not read for correctness here). Timed
with CUDA events around the Python calls (host overhead included), synced and back to back in
interleaved rounds (benchmarks/_variants.py). TFLOP/s counts the GEMMs (2 * batch * params).

    PYTHONPATH=packages/te-core/src:packages/te-torch/src python3 benchmarks/decode.py
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections import OrderedDict

import te_core._C as C
import te_torch as te
import torch
import torch.nn.functional as F
from _variants import time_variants, write_json
from torch.nn.attention import SDPBackend, sdpa_kernel


class TorchLayer(torch.nn.Module):
    """The plain-torch pre-norm decoder layer over a static cache, [b, 1, hidden] a step."""

    def __init__(self, hidden, ffn, heads, groups, batch, max_len, device="cuda", dtype=torch.bfloat16):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.heads, self.groups, self.d = heads, groups, hidden // heads
        self.ln1 = torch.nn.LayerNorm(hidden, **kw)
        self.qkv = torch.nn.Linear(hidden, (heads + 2 * groups) * self.d, **kw)
        self.proj = torch.nn.Linear(hidden, hidden, **kw)
        self.ln2 = torch.nn.LayerNorm(hidden, **kw)
        self.fc1 = torch.nn.Linear(hidden, ffn, **kw)
        self.fc2 = torch.nn.Linear(ffn, hidden, **kw)
        self.k_cache = torch.zeros(batch, groups, max_len, self.d, **kw)
        self.v_cache = torch.zeros(batch, groups, max_len, self.d, **kw)

    def forward(self, x, pos: int):
        b, hidden = x.shape[0], x.shape[-1]
        qkv = self.qkv(self.ln1(x)).view(b, self.heads + 2 * self.groups, self.d)
        q, k, v = qkv.split((self.heads, self.groups, self.groups), dim=1)
        self.k_cache[:, :, pos] = k
        self.v_cache[:, :, pos] = v
        a = F.scaled_dot_product_attention(
            q[:, :, None], self.k_cache[:, :, : pos + 1], self.v_cache[:, :, : pos + 1], enable_gqa=True
        )
        x = x + self.proj(a.reshape(b, 1, hidden))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--ffn", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--warmup-ms", type=float, default=100.0, help="per row and round, after --warmup")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.hidden % args.heads or args.heads % args.groups:
        print("decode.py: --heads must divide --hidden and --groups divide --heads", file=sys.stderr)
        return 2
    if not torch.cuda.is_available() or not C.BUILT_WITH_CUDA:
        print(
            "benchmarks/decode.py: needs a CUDA GPU and a CUDA build of te-core "
            f"(torch.cuda.is_available()={torch.cuda.is_available()}, te_core built with CUDA="
            f"{C.BUILT_WITH_CUDA})",
            file=sys.stderr,
        )
        return 1
    torch.manual_seed(0)
    n, b, ctx, h, f = args.layers, args.batch, args.context, args.hidden, args.ffn
    heads, groups, d = args.heads, args.groups, args.hidden // args.heads
    page = args.page_size
    max_len = -(-(ctx + 8 * b + 16 * page) // page) * page  # room for the ragged row, in pages
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}; decode step of {n} layers, batch {b}, "
        f"context {ctx}+, hidden {h}, ffn {f}, {heads} heads / {groups} groups"
    )
    print(
        f"{'':4s} {'variant':14s} {'ms':>9s} {'TFLOP/s':>8s} {'vs torch':>8s} {'b2b ms':>9s} {'vs torch':>8s}"
    )
    params_per_layer = h * (heads + 2 * groups) * d + h * h + 2 * h * f
    flops = 2.0 * b * n * params_per_layer
    x = torch.randn(b, 1, h, device="cuda", dtype=torch.bfloat16)

    def torch_row(backends=None):
        layers = [TorchLayer(h, f, heads, groups, b, max_len) for _ in range(n)]
        pos = [ctx]

        @torch.no_grad()
        def step():
            if pos[0] == max_len:
                pos[0] = ctx
            y = x
            with sdpa_kernel(backends) if backends else contextlib.nullcontext():
                for layer in layers:
                    y = layer(y, pos[0])
            pos[0] += 1
            return y

        return step

    def te_row(paged: bool, recipe=None, ragged: bool = False):
        layers = [
            te.TransformerLayer(
                h, f, heads, num_gqa_groups=groups, hidden_dropout=0.0, attention_dropout=0.0,
                layer_number=i + 1, attn_input_format="bshd", params_dtype=torch.bfloat16, device="cuda",
            ).eval()
            for i in range(n)
        ]  # fmt: skip
        paging = {
            "is_paged": True,
            "total_num_pages": b * max_len // args.page_size,
            "page_size": args.page_size,
        }
        params = te.InferenceParams(
            b, max_len, groups, d, torch.bfloat16, device="cuda", **(paging if paged else {})
        )
        for i in range(n):
            params.allocate_memory(i + 1)
        prompt = OrderedDict((i, ctx + (8 * i if ragged else 0)) for i in range(b))
        one = OrderedDict((i, 1) for i in range(b))
        params.pre_step(prompt)

        @torch.no_grad()
        def step():
            if params.max_seqlen_kv == max_len:
                params.reset()
                params.pre_step(prompt)
            params.pre_step(one)
            with te.autocast(enabled=recipe is not None, recipe=recipe):
                y = x
                for layer in layers:
                    y = layer(y, self_attn_mask_type="padding_causal", inference_params=params)
            return y

        return step

    variants = [
        ("torch", lambda: torch_row([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION])),
        ("torch_any", torch_row),
        ("te_bf16", lambda: te_row(False)),
        ("te_paged", lambda: te_row(True)),
        ("te_current", lambda: te_row(False, te.recipe.Float8CurrentScaling())),
        ("te_ragged", lambda: te_row(False, ragged=True)),
    ]
    info = {"layers": n, "batch": b, "context": ctx, "hidden": h, "ffn": f, "heads": heads, "groups": groups}
    results = time_variants(variants, info, flops, args, "    ")
    if args.json:
        write_json(args.json, args, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
