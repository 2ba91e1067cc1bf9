"""te.DotProductAttention's masks: TE's mask types, padding, sliding windows and biases turned into
what torch's scaled_dot_product_attention takes (a boolean keep-mask or a float bias).

Conventions (TE's): a user's ``attention_mask`` is True where attention is masked OUT; the
keep-masks here are True where it is kept. Query i of a [s_q x s_kv] score matrix sees key j when

    j - i - shift <= right  (right = 0 for causal masks)   and   j - i - shift >= -left,

a bound of -1 meaning none, with shift = 0 for a top-left diagonal and s_kv - s_q (each sequence's
own lengths under padding) for a bottom-right one.
"""

from __future__ import annotations

import math

import torch

MASK_TYPES = (
    "no_mask",
    "padding",
    "causal",
    "padding_causal",
    "causal_bottom_right",
    "padding_causal_bottom_right",
    "arbitrary",
)
_ALIASES = {"padding,causal": "padding_causal", "causal,padding": "padding_causal"}
BIAS_TYPES = ("no_bias", "pre_scale_bias", "post_scale_bias", "alibi")


def mask_type(owner: str, value) -> str:
    value = _ALIASES.get(value, value)
    if value not in MASK_TYPES:
        raise ValueError(
            f"{owner}: attn_mask_type: expected one of {MASK_TYPES + tuple(_ALIASES)}, got {value!r}"
        )
    return value


def window(owner: str, value, kind: str) -> tuple[int, int]:
    """(left, right), -1 for no bound; causal masks have right = 0 (TE's (-1, 0))."""
    causal = "causal" in kind
    if value is None:
        return (-1, 0) if causal else (-1, -1)
    if (
        not isinstance(value, (tuple, list))
        or len(value) != 2
        or any(isinstance(w, bool) or not isinstance(w, int) or w < -1 for w in value)
    ):
        raise ValueError(
            f"{owner}: window_size: expected (left, right) ints >= -1 (-1: no bound), got {value!r}"
        )
    left, right = value
    if causal and right not in (0, -1):
        raise ValueError(
            f"{owner}: window_size: a causal mask ({kind}) sees no key to the right of the diagonal; "
            f"expected right = 0, got {value!r}"
        )
    return (left, 0) if causal else (left, right)


def bottom_right(kind: str, value) -> bool:
    """Whether the diagonal (of a causal mask or a window) is aligned bottom-right: TE's
    ``bottom_right_diagonal``, by default False for causal / padding_causal only."""
    if value is not None:
        return bool(value)
    return kind not in ("causal", "padding_causal")


def padding_valid(
    owner: str,
    attention_mask,
    cu_seqlens_q,
    cu_seqlens_kv,
    b: int,
    sq: int,
    skv: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(valid_q [b, s_q], valid_kv [b, s_kv]) bools for a padding mask type, from TE's padding
    mask ([b, 1, 1, s], or a (q, kv) pair of them for cross attention; True = padding) or from
    cu_seqlens (each sequence's first tokens are real); None when neither is given."""
    if attention_mask is not None:
        pair = (
            attention_mask if isinstance(attention_mask, (tuple, list)) else (attention_mask, attention_mask)
        )
        if len(pair) != 2:
            raise ValueError(
                f"{owner}: attention_mask: expected a tensor or a (q, kv) pair, got {len(pair)} items"
            )
        out = []
        for m, s, side in ((pair[0], sq, "q"), (pair[1], skv, "kv")):
            if not isinstance(m, torch.Tensor) or m.dtype != torch.bool or tuple(m.shape) != (b, 1, 1, s):
                raise ValueError(
                    f"{owner}: attention_mask: a padding mask ({side} side) is a bool [b, 1, 1, s] = "
                    f"{[b, 1, 1, s]} tensor, True where a token is padding; got "
                    f"{tuple(m.shape) if isinstance(m, torch.Tensor) else type(m).__name__}"
                    f"{' ' + str(m.dtype) if isinstance(m, torch.Tensor) else ''} (cross attention with "
                    "s_q != s_kv takes a (q mask, kv mask) pair)"
                )
            out.append(~m.to(device).view(b, s))
        return out[0], out[1]
    if cu_seqlens_q is None and cu_seqlens_kv is None:
        return None
    valid = []
    for cu, s, arg in ((cu_seqlens_q, sq, "cu_seqlens_q"), (cu_seqlens_kv, skv, "cu_seqlens_kv")):
        if cu is None:
            cu, arg = (
                (cu_seqlens_kv, "cu_seqlens_kv") if arg == "cu_seqlens_q" else (cu_seqlens_q, "cu_seqlens_q")
            )
        check_cu_seqlens(owner, arg, cu, b)
        lens = (cu[1:] - cu[:-1]).to(device)
        valid.append(torch.arange(s, device=device)[None, :] < lens[:, None])
    return valid[0], valid[1]


def check_cu_seqlens(owner: str, arg: str, cu, b: int | None) -> None:
    if (
        not isinstance(cu, torch.Tensor)
        or cu.dim() != 1
        or cu.dtype not in (torch.int32, torch.int64)
        or (b is not None and cu.numel() != b + 1)
        or cu.numel() < 2
    ):
        want = f"[b + 1 = {b + 1}]" if b is not None else "[b + 1]"
        raise ValueError(
            f"{owner}: {arg}: expected an int32 tensor {want} of sequence boundaries (0, l0, l0 + l1, "
            f"...), got {f'{cu.dtype} {tuple(cu.shape)}' if isinstance(cu, torch.Tensor) else type(cu)}"
        )


def keep_mask(
    kind: str,
    valid: tuple[torch.Tensor, torch.Tensor] | None,
    arbitrary: torch.Tensor | None,
    win: tuple[int, int],
    br: bool,
    sq: int,
    skv: int,
    device: torch.device,
) -> torch.Tensor | None:
    """The keep-mask [b or 1, h or 1, s_q, s_kv] (True = attend), or None when every pair attends."""
    keep = None
    if arbitrary is not None:
        keep = ~arbitrary
    if valid is not None:
        vq, vkv = valid
        pad = vq[:, None, :, None] & vkv[:, None, None, :]
        keep = pad if keep is None else keep & pad
    left, right = win
    if left >= 0 or right >= 0:
        i = torch.arange(sq, device=device)[:, None]
        j = torch.arange(skv, device=device)[None, :]
        rel = (j - i)[None, None]  # [1, 1, s_q, s_kv]
        if br:
            if valid is not None:
                shift = (valid[1].sum(-1) - valid[0].sum(-1)).view(-1, 1, 1, 1)
            else:
                shift = skv - sq
            rel = rel - shift
        band = torch.ones_like(rel, dtype=torch.bool)
        if right >= 0:
            band = band & (rel <= right)
        if left >= 0:
            band = band & (rel >= -left)
        keep = band if keep is None else keep & band
    return keep


def alibi_slopes_default(heads: int, device: torch.device) -> torch.Tensor:
    """ALiBi's head slopes: 2^(-8 k / n) for k = 1..n with n the largest power of two <= heads,
    then, for the heads past n, every other slope of the 2n sequence (Press et al.)."""
    n = 2 ** math.floor(math.log2(heads))
    slopes = [2.0 ** (-8.0 * k / n) for k in range(1, n + 1)]
    if n < heads:
        slopes += [2.0 ** (-4.0 * k / n) for k in range(1, 2 * (heads - n), 2)]
    return torch.tensor(slopes, dtype=torch.float32, device=device)


def alibi_bias(
    slopes: torch.Tensor, valid, br: bool, sq: int, skv: int, device: torch.device
) -> torch.Tensor:
    """-slope * |j - i - shift| [b or 1, h, s_q, s_kv] fp32, the diagonal aligned as the mask's."""
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(skv, device=device)[None, :]
    rel = (j - i)[None, None].float()
    if br:
        shift = (valid[1].sum(-1) - valid[0].sum(-1)).view(-1, 1, 1, 1) if valid is not None else skv - sq
        rel = rel - shift
    s = slopes.float().to(device)
    s = s.view(1, -1, 1, 1) if s.dim() == 1 else s.view(s.shape[0], s.shape[1], 1, 1)
    return -s * rel.abs()
