"""The demo's GPT, built from te modules: per block a ``te.LayerNormLinear`` (pre-norm + QKV),
torch's ``scaled_dot_product_attention`` (causal), a ``te.Linear`` (attention output projection)
and a ``te.LayerNormMLP`` (pre-norm + FC1 + GELU + FC2); learned positions, a final
``te.LayerNorm`` and a head tied to the token embedding.

Precision: parameters stay fp32 (AdamW's master weights); the caller runs the forward inside
``torch.autocast(dtype=torch.bfloat16)`` and the model hands every te module its input in the
autocast dtype, which is what Transformer Engine's modules do by themselves under torch.autocast
(te's modules compute in their input's dtype). Inside ``te.autocast`` the GEMMs of the te
modules run in FP8 and write bf16; the residual stream, the embedding sum and the loss stay fp32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import te_torch as te
import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class GPTConfig:
    """Model shape. ``vocab``: token ids are bytes (256); ``seq``: the longest sequence (learned
    positions); ``hidden`` = ``heads`` * head size; ``ffn``: the MLP's inner width."""

    vocab: int = 256
    seq: int = 512
    layers: int = 12
    hidden: int = 768
    heads: int = 12
    ffn: int = 3072

    def __post_init__(self) -> None:
        for name in ("vocab", "seq", "layers", "hidden", "heads", "ffn"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"GPTConfig: {name}: expected an int >= 1, got {v!r}")
        if self.hidden % self.heads:
            raise ValueError(
                f"GPTConfig: heads: expected a divisor of hidden={self.hidden}, got {self.heads}"
            )


def _normal(std: float):
    def init(w: torch.Tensor) -> None:
        torch.nn.init.normal_(w, 0.0, std)

    return init


def _compute_dtype(x: torch.Tensor) -> torch.Tensor:
    """x in the enclosing torch.autocast dtype (unchanged outside autocast)."""
    dev = x.device.type
    if torch.is_autocast_enabled(dev):
        return x.to(torch.get_autocast_dtype(dev))
    return x


class Block(torch.nn.Module):
    """Pre-norm Transformer block: x + proj(attn(qkv(ln(x)))), then x + mlp(ln(x))."""

    def __init__(self, cfg: GPTConfig, device: torch.device) -> None:
        super().__init__()
        std, out_std = 0.02, 0.02 / math.sqrt(2 * cfg.layers)  # GPT-2's residual-branch scaling
        self.heads = cfg.heads
        self.qkv = te.LayerNormLinear(cfg.hidden, 3 * cfg.hidden, init_method=_normal(std), device=device)
        self.proj = te.Linear(cfg.hidden, cfg.hidden, init_method=_normal(out_std), device=device)
        self.mlp = te.LayerNormMLP(
            cfg.hidden,
            cfg.ffn,
            activation="gelu",
            init_method=_normal(std),
            output_layer_init_method=_normal(out_std),
            device=device,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        qkv = self.qkv(_compute_dtype(x)).view(b, s, 3, self.heads, h // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [b, heads, s, head size]
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
        return x + self.mlp(_compute_dtype(x))


class GPT(torch.nn.Module):
    """Byte-level GPT: ``forward(idx [b, s] int64)`` -> logits [b, s, vocab] (autocast dtype)."""

    def __init__(self, cfg: GPTConfig, device: torch.device | str) -> None:
        super().__init__()
        device = torch.device(device)
        self.cfg = cfg
        self.wte = torch.nn.Embedding(cfg.vocab, cfg.hidden, device=device)
        self.wpe = torch.nn.Embedding(cfg.seq, cfg.hidden, device=device)
        torch.nn.init.normal_(self.wte.weight, 0.0, 0.02)
        torch.nn.init.normal_(self.wpe.weight, 0.0, 0.02)
        self.blocks = torch.nn.ModuleList(Block(cfg, device) for _ in range(cfg.layers))
        self.ln_f = te.LayerNorm(cfg.hidden, device=device)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if idx.dim() != 2 or idx.shape[1] > self.cfg.seq or idx.dtype != torch.int64:
            raise ValueError(
                f"GPT: idx: expected int64 [batch, seq <= {self.cfg.seq}], got {idx.dtype} {tuple(idx.shape)}"
            )
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(_compute_dtype(x)), self.wte.weight)

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-byte cross entropy (nats), computed in fp32."""
        logits = self(idx)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))

    def param_groups(self, weight_decay: float) -> list[dict]:
        """AdamW groups: weight decay on matrices and embeddings, none on biases and norm scales."""
        decay = [p for p in self.parameters() if p.dim() >= 2]
        rest = [p for p in self.parameters() if p.dim() < 2]
        return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]
