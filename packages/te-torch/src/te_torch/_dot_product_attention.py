"""``te.DotProductAttention``: TE's attention core, softmax(q k^T * scale + bias) v per head, on
torch's ``scaled_dot_product_attention`` (FlashAttention, cuDNN or memory-efficient kernels on the
GPU as torch picks them; the math path on the CPU).

Layouts (TE's ``qkv_format``): ``sbhd`` [s, b, h, d], ``bshd`` [b, s, h, d], and ``thd``: packed
sequences [t, h, d] bounded by ``cu_seqlens`` (each sequence is attended to alone; tokens between
``cu_seqlens_*_padded`` boundaries and past the last sequence come out zero). The output merges
the heads: [s, b, h * d_v], [b, s, h * d_v] or [t, h * d_v].

The attention runs in the inputs' dtype (TE's FlashAttention / fused paths; no FP8 attention:
a recipe's ``fp8_dpa`` / ``fp8_mha`` is told once at INFO and the core stays high precision).
A query that sees no key (padding, or a window past the sequence) gives zeros, not NaN.
"""

from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from te_torch import _attention_mask as masks
from te_torch._autocast import get_fp8_recipe
from te_torch._availability import default_device
from te_torch._checkpoint import checkpoint
from te_torch._inference import InferenceParams
from te_torch._info_once import info_once
from te_torch._module_base import FLOAT_DTYPES, DropsTeExtraState, check_size

__all__ = ["DotProductAttention"]

QKV_FORMATS = ("sbhd", "bshd", "thd")
SOFTMAX_TYPES = ("vanilla", "off-by-one", "learnable")
# enable_gqa (grouped key/value heads without a copy) came with torch 2.5.
_GQA_KWARG = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 5)
_CACHED_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
# TE forward arguments te takes at their defaults only; anything else names itself.
_FORWARD_DEFAULTS = {
    "fp8_output": False,
    "score_mod": None,
    "score_mod_bprop": None,
    "score_mod_tensors": None,
    "score_mod_bprop_tensors": None,
    "qkv_layer": None,
    "kv_layer": None,
}
_FORWARD_IGNORED = ("bf16_backward", "num_splits", "qkv_interleave_dim", "fast_zero_fill", "pad_between_seqs")


def _dims(owner: str, kv_channels) -> tuple[int, int]:
    if isinstance(kv_channels, (tuple, list)):
        if len(kv_channels) != 2:
            raise ValueError(
                f"{owner}: kv_channels: expected an int or (head_dim_qk, head_dim_v), got {kv_channels!r}"
            )
        return check_size(owner, "kv_channels[0]", kv_channels[0]), check_size(
            owner, "kv_channels[1]", kv_channels[1]
        )
    d = check_size(owner, "kv_channels", kv_channels)
    return d, d


class DotProductAttention(DropsTeExtraState, torch.nn.Module):
    """Scaled dot-product attention over heads, TE's module of the same name (no parameters but
    ``softmax_offset`` for ``softmax_type="learnable"``).

    Args (TE's names and defaults):
        num_attention_heads: query heads (over all tensor-parallel ranks; each rank has
            num_attention_heads / tp_size).
        kv_channels: the head dimension, or (head_dim_qk, head_dim_v).
        num_gqa_groups: key/value heads (grouped-query attention; default num_attention_heads),
            a divisor of num_attention_heads. Query head i uses key/value head i // (h / g).
        attention_dropout: dropout on the attention probabilities in training mode.
        qkv_format: the default layout, ``"sbhd"``, ``"bshd"`` or ``"thd"``.
        attn_mask_type: the default mask: ``"no_mask"``, ``"padding"``, ``"causal"``,
            ``"padding_causal"`` (also ``"padding,causal"`` / ``"causal,padding"``),
            ``"causal_bottom_right"``, ``"padding_causal_bottom_right"``, ``"arbitrary"``.
        window_size: (left, right) sliding window, -1 for no bound (causal: right = 0).
        bottom_right_diagonal: align the causal diagonal / window bottom-right (query i of s_q
            sees keys up to i + s_kv - s_q); default: top-left for ``"causal"`` and
            ``"padding_causal"`` only.
        sequence_parallel, tp_group, layer_number, cp_comm_type, name: accepted (the core has no
            communication); cp_group with more than one rank: NotImplementedError.
        tp_size: divides the heads (as TE).
        get_rng_state_tracker: Megatron's tracker: dropout draws inside its ``fork()``.
        attention_type: ``"self"`` or ``"cross"`` (only how a padding mask is given).
        softmax_scale: default 1 / sqrt(head_dim_qk).
        softmax_type: ``"vanilla"``; ``"off-by-one"`` adds 1 to the softmax denominator;
            ``"learnable"`` adds exp(softmax_offset[h]) (a parameter [1, h, 1, 1] fp32, zeros).
        return_max_logit: forward also returns the largest masked, scaled score per head [h]
            fp32 (for QK-clip).
        device: where softmax_offset lives (default: CUDA when te can run there).
    """

    def __init__(
        self,
        num_attention_heads: int,
        kv_channels: int | tuple[int, int],
        num_gqa_groups: int | None = None,
        attention_dropout: float = 0.0,
        qkv_format: str = "sbhd",
        attn_mask_type: str = "causal",
        window_size: tuple[int, int] | None = None,
        bottom_right_diagonal: bool | None = None,
        sequence_parallel: bool = False,
        tp_size: int = 1,
        get_rng_state_tracker=None,
        tp_group=None,
        layer_number: int | None = None,
        attention_type: str = "self",
        cp_group=None,
        cp_global_ranks=None,
        cp_stream=None,
        cp_comm_type: str = "p2p",
        softmax_scale: float | None = None,
        softmax_type: str = "vanilla",
        return_max_logit: bool = False,
        name: str | None = None,
        device=None,
    ) -> None:
        super().__init__()
        owner = "DotProductAttention"
        check_size(owner, "num_attention_heads", num_attention_heads)
        self.tp_size = check_size(owner, "tp_size", tp_size)
        groups = (
            num_attention_heads
            if num_gqa_groups is None
            else check_size(owner, "num_gqa_groups", num_gqa_groups)
        )
        if num_attention_heads % groups:
            raise ValueError(
                f"{owner}: num_gqa_groups: expected a divisor of num_attention_heads={num_attention_heads}, "
                f"got {groups}"
            )
        for arg, total in (("num_attention_heads", num_attention_heads), ("num_gqa_groups", groups)):
            if total % self.tp_size:
                raise ValueError(f"{owner}: {arg}={total}: expected a multiple of tp_size={self.tp_size}")
        self.num_attention_heads = num_attention_heads
        self.num_gqa_groups = groups
        self.heads = num_attention_heads // self.tp_size
        self.kv_heads = groups // self.tp_size
        self.head_dim_qk, self.head_dim_v = _dims(owner, kv_channels)
        self.hidden_size_per_partition = self.heads * self.head_dim_v
        if (
            isinstance(attention_dropout, bool)
            or not isinstance(attention_dropout, numbers.Real)
            or not (0 <= attention_dropout < 1)
        ):
            raise ValueError(
                f"{owner}: attention_dropout: expected a probability in [0, 1), got {attention_dropout!r}"
            )
        self.attention_dropout = float(attention_dropout)
        if qkv_format not in QKV_FORMATS:
            raise ValueError(f"{owner}: qkv_format: expected one of {QKV_FORMATS}, got {qkv_format!r}")
        self.qkv_format = qkv_format
        self.attn_mask_type = masks.mask_type(owner, attn_mask_type)
        self.window_size = (
            masks.window(owner, window_size, self.attn_mask_type) if window_size is not None else None
        )
        self.bottom_right_diagonal = bottom_right_diagonal
        if attention_type not in ("self", "cross"):
            raise ValueError(f"{owner}: attention_type: expected 'self' or 'cross', got {attention_type!r}")
        self.attention_type = attention_type
        if cp_group is not None and _group_size(cp_group) > 1:
            raise NotImplementedError(f"{owner}: cp_group: context parallelism is not implemented in te yet")
        if softmax_scale is None:
            softmax_scale = 1.0 / math.sqrt(self.head_dim_qk)
        if (
            isinstance(softmax_scale, bool)
            or not isinstance(softmax_scale, numbers.Real)
            or not (0 < softmax_scale < float("inf"))
        ):
            raise ValueError(f"{owner}: softmax_scale: expected a finite number > 0, got {softmax_scale!r}")
        self.softmax_scale = float(softmax_scale)
        if softmax_type not in SOFTMAX_TYPES:
            raise ValueError(f"{owner}: softmax_type: expected one of {SOFTMAX_TYPES}, got {softmax_type!r}")
        self.softmax_type = softmax_type
        if softmax_type == "learnable":
            dev = default_device() if device is None else torch.device(device)
            self.softmax_offset = torch.nn.Parameter(
                torch.zeros(1, self.heads, 1, 1, dtype=torch.float32, device=dev)
            )
        self.return_max_logit = bool(return_max_logit)
        self.get_rng_state_tracker = get_rng_state_tracker
        self.sequence_parallel = sequence_parallel
        self.tp_group = tp_group
        self.layer_number = layer_number
        self.name = name

    def forward(
        self,
        query_layer: torch.Tensor,
        key_layer: torch.Tensor,
        value_layer: torch.Tensor,
        attention_mask=None,
        qkv_format: str | None = None,
        cu_seqlens_q: torch.Tensor | None = None,
        cu_seqlens_kv: torch.Tensor | None = None,
        cu_seqlens_q_padded: torch.Tensor | None = None,
        cu_seqlens_kv_padded: torch.Tensor | None = None,
        max_seqlen_q: int | None = None,
        max_seqlen_kv: int | None = None,
        attn_mask_type: str | None = None,
        window_size: tuple[int, int] | None = None,
        bottom_right_diagonal: bool | None = None,
        checkpoint_core_attention: bool = False,
        core_attention_bias_type: str = "no_bias",
        core_attention_bias: torch.Tensor | None = None,
        alibi_slopes: torch.Tensor | None = None,
        inference_params=None,
        **kwargs,
    ):
        """Attention of ``query_layer`` over ``key_layer`` / ``value_layer``.

        Args:
            query_layer: [s_q, b, h, d_qk] / [b, s_q, h, d_qk] / [t_q, h, d_qk] by ``qkv_format``.
            key_layer, value_layer: the same layout with g key/value heads, d_qk / d_v channels.
            attention_mask: True = masked out. Padding types: a bool [b, 1, 1, s] (self attention)
                or a (q [b, 1, 1, s_q], kv [b, 1, 1, s_kv]) pair, or none with ``cu_seqlens_*``;
                ``"arbitrary"``: a bool tensor broadcastable to [b, h, s_q, s_kv].
            qkv_format, attn_mask_type, window_size, bottom_right_diagonal: this call's, else the
                module's.
            cu_seqlens_q, cu_seqlens_kv: int32 [b + 1] sequence boundaries: ``"thd"``'s sequences,
                or the real lengths of padded ``sbhd`` / ``bshd`` batches (tokens first).
            cu_seqlens_q_padded, cu_seqlens_kv_padded: ``"thd"``: where each sequence starts in the
                packed tensor when padding sits between sequences.
            max_seqlen_q, max_seqlen_kv: ``"thd"``: the longest sequence (else found with one host
                sync). It must be at least the longest sequence: te checks it only when the
                ``cu_seqlens`` are on the CPU (on the GPU the check would be the host sync these
                arguments exist to avoid).
            checkpoint_core_attention: recompute the attention in backward instead of saving it.
            core_attention_bias_type: ``"no_bias"``, ``"pre_scale_bias"`` (added before the
                scale), ``"post_scale_bias"`` (after), ``"alibi"`` (-slope * distance).
            core_attention_bias: the bias, broadcastable to [b, h, s_q, s_kv] (TE's [1, h, s_q,
                s_kv], [b, 1, ...], ...); it gets a gradient if it requires one.
            alibi_slopes: [h] or [b, h] fp32 (default: ALiBi's geometric slopes).
            inference_params: a te.InferenceParams KV cache (after its ``pre_step``): the new
                keys and values go into the cache under this module's ``layer_number`` and the
                queries attend over each sequence's whole history. The batch and its lengths
                are the step's (``cu_seqlens_*`` and ``attention_mask`` are not read): bshd /
                sbhd queries hold each sequence's new tokens first, thd ones are packed by the
                step's lengths. Causal types align the diagonal bottom-right (a new token sees
                its sequence up to itself), ``"no_mask"`` / ``"padding"`` see the whole
                sequence; windows count back from each token. Not with ``"arbitrary"`` or a
                pre-/post-scale bias (their key length changes every step).

        Returns:
            The attention output with merged heads ([s_q, b, h * d_v] / [b, s_q, h * d_v] /
            [t_q, h * d_v]), in the query's dtype; with ``return_max_logit`` also the max logit
            per head [h] fp32.
        """
        owner = "DotProductAttention"
        for key, value in kwargs.items():
            if key in _FORWARD_DEFAULTS:
                if isinstance(value, torch.Tensor) or value != _FORWARD_DEFAULTS[key]:
                    shown = _describe(value) if isinstance(value, torch.Tensor) else repr(value)
                    raise NotImplementedError(f"{owner}.forward: {key}={shown} is not implemented in te yet")
            elif key not in _FORWARD_IGNORED:
                raise TypeError(f"{owner}.forward: unexpected keyword argument {key!r}")
        recipe = get_fp8_recipe()
        if recipe is not None and (getattr(recipe, "fp8_dpa", False) or getattr(recipe, "fp8_mha", False)):
            info_once(
                "fp8_dpa",
                "te.DotProductAttention: the recipe's fp8_dpa / fp8_mha: te has no FP8 attention yet; "
                "the attention core runs in the inputs' dtype",
            )
        fmt = self.qkv_format if qkv_format is None else qkv_format
        if fmt not in QKV_FORMATS:
            raise ValueError(f"{owner}: qkv_format: expected one of {QKV_FORMATS}, got {fmt!r}")
        kind = self.attn_mask_type if attn_mask_type is None else masks.mask_type(owner, attn_mask_type)
        if window_size is None:
            window_size = self.window_size
        win = masks.window(owner, window_size, kind)
        br = masks.bottom_right(
            kind, self.bottom_right_diagonal if bottom_right_diagonal is None else bottom_right_diagonal
        )
        q, k, v = self._check_qkv(owner, fmt, query_layer, key_layer, value_layer)
        if core_attention_bias_type not in masks.BIAS_TYPES:
            raise ValueError(
                f"{owner}: core_attention_bias_type: expected one of {masks.BIAS_TYPES}, "
                f"got {core_attention_bias_type!r}"
            )
        if inference_params is not None:
            return self._cached(
                owner, q, k, v, fmt, kind, win, inference_params, attention_mask, checkpoint_core_attention,
                core_attention_bias_type, core_attention_bias, alibi_slopes,
            )  # fmt: skip
        if fmt == "thd":
            return self._thd(
                owner, q, k, v, kind, win, br, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded,
                cu_seqlens_kv_padded, max_seqlen_q, max_seqlen_kv, attention_mask, checkpoint_core_attention,
                core_attention_bias_type, core_attention_bias, alibi_slopes,
            )  # fmt: skip
        perm = (1, 2, 0, 3) if fmt == "sbhd" else (0, 2, 1, 3)
        q, k, v = (x.permute(*perm) for x in (q, k, v))  # [b, h, s, d]
        b, sq, skv = q.shape[0], q.shape[2], k.shape[2]
        valid = None
        if "padding" in kind:
            valid = masks.padding_valid(
                owner, attention_mask, cu_seqlens_q, cu_seqlens_kv, b, sq, skv, q.device
            )
        elif kind != "arbitrary" and attention_mask is not None:
            raise ValueError(
                f"{owner}: attention_mask: given with attn_mask_type={kind!r}, which takes none; use a "
                "padding type or 'arbitrary'"
            )
        out, max_logit = self._core(
            owner, q, k, v, kind, valid, attention_mask, win, br, checkpoint_core_attention,
            core_attention_bias_type, core_attention_bias, alibi_slopes,
        )  # fmt: skip
        if fmt == "sbhd":
            out = out.permute(2, 0, 1, 3).reshape(sq, b, -1)
        else:
            out = out.permute(0, 2, 1, 3).reshape(b, sq, -1)
        return (out, max_logit) if self.return_max_logit else out

    def _check_qkv(self, owner: str, fmt: str, q, k, v):
        ndim = 3 if fmt == "thd" else 4
        for arg, x, heads, d in (
            ("query_layer", q, self.heads, self.head_dim_qk),
            ("key_layer", k, self.kv_heads, self.head_dim_qk),
            ("value_layer", v, self.kv_heads, self.head_dim_v),
        ):
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"{owner}: {arg}: expected a torch.Tensor, got {type(x).__name__}")
            if x.dim() != ndim or x.shape[-2] != heads or x.shape[-1] != d:
                raise ValueError(
                    f"{owner}: {arg}: expected a {ndim}-d {fmt} tensor with {heads} heads of {d} channels "
                    f"([..., {heads}, {d}]), got shape {tuple(x.shape)}"
                )
            if x.dtype not in FLOAT_DTYPES or x.dtype != q.dtype:
                raise TypeError(
                    f"{owner}: {arg}: expected fp32, bf16 or fp16 like query_layer ({q.dtype}), got {x.dtype}"
                )
            if x.device != q.device:
                raise ValueError(
                    f"{owner}: {arg}: expected it on query_layer's device {q.device}, got {x.device}"
                )
        if k.shape[:-1] != v.shape[:-1]:
            raise ValueError(
                f"{owner}: value_layer: expected key_layer's shape but the last dim {tuple(k.shape[:-1])}, "
                f"got {tuple(v.shape)}"
            )
        if fmt != "thd":
            bdim = 1 if fmt == "sbhd" else 0
            if q.shape[bdim] != k.shape[bdim]:
                raise ValueError(
                    f"{owner}: key_layer: expected query_layer's batch size {q.shape[bdim]}, "
                    f"got {k.shape[bdim]}"
                )
        return q, k, v

    def _core(
        self, owner, q, k, v, kind, valid, attention_mask, win, br, recompute, bias_type, bias, slopes,
        memo=None,
    ):  # fmt: skip
        """q [b, h, s_q, d], k / v [b, g, s_kv, d] -> ([b, h, s_q, d_v], max logit or None).
        ``memo(key, make)``: where the masks can be shared (a KV-cache step's layers)."""
        b, h, sq, skv = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
        arbitrary = None
        if kind == "arbitrary":
            if not isinstance(attention_mask, torch.Tensor) or attention_mask.dtype != torch.bool:
                raise ValueError(
                    f"{owner}: attention_mask: attn_mask_type='arbitrary' takes a bool tensor (True = masked "
                    f"out) broadcastable to [b, h, s_q, s_kv] = {[b, h, sq, skv]}"
                )
            try:
                torch.broadcast_shapes(attention_mask.shape, (b, h, sq, skv))
            except RuntimeError:
                raise ValueError(
                    f"{owner}: attention_mask: expected a shape broadcastable to [b, h, s_q, s_kv] = "
                    f"{[b, h, sq, skv]}, got {tuple(attention_mask.shape)}"
                ) from None
            if attention_mask.dim() != 4:
                raise ValueError(
                    f"{owner}: attention_mask: expected 4 dims [b, h, s_q, s_kv], got {attention_mask.dim()}"
                )
            arbitrary = attention_mask.to(q.device)
        add = self._bias(owner, bias_type, bias, slopes, valid, br, b, h, sq, skv, q)
        sink = None
        if self.softmax_type != "vanilla":
            sink = (
                self.softmax_offset.float()
                if self.softmax_type == "learnable"
                else torch.zeros(1, h, 1, 1, dtype=torch.float32, device=q.device)
            )
        # A plain top-left causal mask goes to torch as is_causal (FlashAttention takes no mask).
        causal = (
            win == (-1, 0)
            and (not br or sq == skv)
            and valid is None
            and arbitrary is None
            and add is None
            and sink is None
            and not self.return_max_logit
        )
        keep = seen = None
        if not causal:

            def make():
                keep = masks.keep_mask(kind, valid, arbitrary, win, br, sq, skv, q.device)
                if keep is None or sink is not None:
                    return keep, None
                # A query row that sees no key would be NaN (softmax of nothing): it attends to
                # everything instead and is zeroed after, so neither it nor its gradient is NaN.
                seen = keep.any(dim=-1, keepdim=True)
                return keep | ~seen, seen

            keep, seen = make() if memo is None else memo((kind, win, br, sq, skv, sink is None), make)
        max_logit = None
        if self.return_max_logit:
            max_logit = self._max_logit(q, k, keep if seen is None else keep & seen, add)
        dropout = self.attention_dropout if self.training else 0.0
        args = (q, k, v, keep, seen, add, sink, causal)
        if recompute:
            out = checkpoint(
                self._attend,
                *args,
                dropout,
                get_rng_state_tracker=self.get_rng_state_tracker,
                use_reentrant=False,
            )
        else:
            out = self._attend(*args, dropout)
        return out, max_logit

    def _bias(self, owner, bias_type, bias, slopes, valid, br, b, h, sq, skv, q):
        if bias_type == "no_bias":
            if bias is not None:
                raise ValueError(
                    f"{owner}: core_attention_bias: given with core_attention_bias_type='no_bias'"
                )
            return None
        if bias_type == "alibi":
            if bias is not None:
                raise ValueError(
                    f"{owner}: core_attention_bias: not taken with core_attention_bias_type='alibi'"
                )
            if slopes is None:
                slopes = masks.alibi_slopes_default(self.num_attention_heads, q.device)
                if self.tp_size > 1:
                    rank = torch.distributed.get_rank(self.tp_group) if self.tp_group is not None else 0
                    slopes = slopes[rank * h : (rank + 1) * h]
            elif not isinstance(slopes, torch.Tensor) or tuple(slopes.shape) not in ((h,), (b, h)):
                raise ValueError(f"{owner}: alibi_slopes: expected a tensor [h={h}] or [b={b}, h={h}]")
            return masks.alibi_bias(slopes, valid, br, sq, skv, q.device)
        if not isinstance(bias, torch.Tensor) or bias.dim() != 4 or bias.dtype not in FLOAT_DTYPES:
            raise ValueError(
                f"{owner}: core_attention_bias: {bias_type} takes a float tensor [1 or b, 1 or h, s_q, "
                f"s_kv], got {_describe(bias)}"
            )
        if bias.shape[0] not in (1, b) or bias.shape[1] not in (1, h) or tuple(bias.shape[2:]) != (sq, skv):
            raise ValueError(
                f"{owner}: core_attention_bias: expected [1 or b={b}, 1 or h={h}, s_q={sq}, s_kv={skv}], got "
                f"{tuple(bias.shape)}"
            )
        bias = bias.to(q.device)
        return bias * self.softmax_scale if bias_type == "pre_scale_bias" else bias

    def _max_logit(self, q, k, keep, add) -> torch.Tensor:
        with torch.no_grad():
            kk = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            s = torch.matmul(q.float(), kk.float().transpose(-1, -2)) * self.softmax_scale
            if add is not None:
                s = s + add.float()
            if keep is not None:
                s = s.masked_fill(~keep, float("-inf"))
            return s.amax(dim=(0, 2, 3))

    def _attend(self, q, k, v, keep, seen, add, sink, causal: bool, dropout: float) -> torch.Tensor:
        """``keep``: the keep-mask, rows that see no key opened; ``seen``: which rows see a key
        (zeroed after where not), or None."""
        h, g = q.shape[1], k.shape[1]
        mask = keep
        if add is not None or sink is not None:
            mask = torch.zeros((), dtype=q.dtype, device=q.device) if add is None else add.to(q.dtype)
            if keep is not None:
                mask = torch.where(keep, mask, float("-inf"))
            if sink is not None:
                # The sink is one more key: a zero key whose score is the offset, with a zero value.
                b, sq, skv = q.shape[0], q.shape[2], k.shape[2]
                mask = mask.expand(mask.shape[0] if mask.dim() == 4 else 1, h, sq, skv)
                mask = torch.cat((mask, sink.to(q.dtype).expand(mask.shape[0], h, sq, 1)), dim=-1)
                k = torch.cat((k, k.new_zeros(b, g, 1, k.shape[-1])), dim=2)
                v = torch.cat((v, v.new_zeros(b, g, 1, v.shape[-1])), dim=2)
        gqa, out = {}, None
        if g != h:
            if mask is None and _GQA_KWARG:
                gqa = {"enable_gqa": True}
            elif mask is not None and mask.dim() == 4 and mask.shape[1] == 1:
                # torch's masked kernels take no grouped heads. With a mask alike for every head,
                # each group's query heads become one longer query sequence over the group's
                # keys, so the keys and values are not copied per head (a KV cache's whole
                # history every decode step).
                b, sq, per = q.shape[0], q.shape[2], h // g
                mask = mask.expand(mask.shape[0], 1, sq, mask.shape[3])
                mask = mask.unsqueeze(2).expand(-1, -1, per, -1, -1).reshape(mask.shape[0], 1, per * sq, -1)
                out = self._sdpa(q.reshape(b, g, per * sq, q.shape[3]), k, v, mask, dropout, False, gqa)
                out = out.reshape(b, h, sq, out.shape[3])  # the kernels' own strides
            else:
                # a per-head mask or bias: the key/value heads are repeated
                k = k.repeat_interleave(h // g, dim=1)
                v = v.repeat_interleave(h // g, dim=1)
        if out is None:
            out = self._sdpa(q, k, v, mask, dropout, causal, gqa)
        if seen is not None:
            out = out * seen.to(out.dtype)
        return out

    def _sdpa(self, q, k, v, mask, dropout, is_causal, gqa) -> torch.Tensor:
        def run():
            return F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=mask,
                dropout_p=dropout,
                is_causal=is_causal,
                scale=self.softmax_scale,
                **gqa,
            )

        if dropout > 0 and self.get_rng_state_tracker is not None:
            with self.get_rng_state_tracker().fork():
                return run()
        return run()

    def _thd(
        self, owner, q, k, v, kind, win, br, cu_q, cu_kv, cu_q_pad, cu_kv_pad, max_q, max_kv, attention_mask,
        recompute, bias_type, bias, slopes,
    ):  # fmt: skip
        if attention_mask is not None:
            raise ValueError(
                f"{owner}: attention_mask: qkv_format='thd' takes cu_seqlens_q / cu_seqlens_kv instead"
            )
        if kind in ("causal", "causal_bottom_right", "no_mask", "arbitrary"):
            raise ValueError(
                f"{owner}: attn_mask_type={kind!r}: qkv_format='thd' takes a padding type ('padding', "
                "'padding_causal', 'padding_causal_bottom_right'): its sequences are padding-bounded"
            )
        if cu_q is None or cu_kv is None:
            raise ValueError(f"{owner}: cu_seqlens_q, cu_seqlens_kv: both needed with qkv_format='thd'")
        masks.check_cu_seqlens(owner, "cu_seqlens_q", cu_q, None)
        b = cu_q.numel() - 1
        masks.check_cu_seqlens(owner, "cu_seqlens_kv", cu_kv, b)
        for arg, cu in (("cu_seqlens_q_padded", cu_q_pad), ("cu_seqlens_kv_padded", cu_kv_pad)):
            if cu is not None:
                masks.check_cu_seqlens(owner, arg, cu, b)
        (qp,), valid_q, bounds_q = _pack((q,), cu_q, cu_q_pad, max_q)
        (kp, vp), valid_kv, _ = _pack((k, v), cu_kv, cu_kv_pad, max_kv)
        out, max_logit = self._core(
            owner, qp, kp, vp, kind, (valid_q, valid_kv), None, win, br, recompute, bias_type, bias, slopes
        )
        out = _unpack(out, bounds_q, q.shape[0])
        return (out, max_logit) if self.return_max_logit else out

    def _cached(
        self, owner, q, k, v, fmt, kind, win, params, attention_mask, recompute, bias_type, bias, slopes
    ):  # fmt: skip
        if not isinstance(params, InferenceParams):
            raise TypeError(
                f"{owner}: inference_params: expected a te.InferenceParams, got {_describe(params)}"
            )
        if self.layer_number is None:
            raise ValueError(
                f"{owner}: layer_number: a KV cache (inference_params) keeps each layer's keys under its "
                "layer_number; construct the module with one"
            )
        if kind == "arbitrary" or attention_mask is not None:
            raise ValueError(
                f"{owner}: attn_mask_type={kind!r} / attention_mask: with inference_params the mask comes "
                "from the cache's lengths; use a causal, padding or no_mask type and no attention_mask"
            )
        if bias_type in ("pre_scale_bias", "post_scale_bias"):
            raise ValueError(
                f"{owner}: core_attention_bias_type={bias_type!r}: not with inference_params (the keys' "
                "length changes every step); 'alibi' is taken"
            )
        kc, vc, cu_q, _, _, _ = params.step(self.layer_number, k, v, fmt)
        b = params.batch_size
        if fmt == "thd":
            (qp,), _, bounds = _pack((q,), cu_q[: b + 1], None, params.max_seqlen_q)
        else:
            qp = q.permute(1, 2, 0, 3) if fmt == "sbhd" else q.permute(0, 2, 1, 3)
        sq = qp.shape[2]
        kc, vc = (x.to(q.dtype).permute(0, 2, 1, 3) for x in (kc, vc))
        causal = "causal" in kind
        # Not torch's cuDNN attention: it builds a plan per key length, i.e. every step.
        with _CudnnAttentionOff():
            if self._maskless(params, causal, win, bias_type, recompute, qp, kc):
                # Every sequence alike (a static batch's step): no padding to mask, and a causal
                # step's diagonal is either one query's last key or a whole new sequence's.
                dropout = self.attention_dropout if self.training else 0.0
                gqa = {"enable_gqa": True} if kc.shape[1] != qp.shape[1] else {}
                out = self._sdpa(qp, kc, vc, None, dropout, causal and sq > 1, gqa)
                max_logit = None
            else:
                cached_kind = "padding_causal_bottom_right" if causal else "padding"
                out, max_logit = self._core(
                    owner, qp, kc, vc, cached_kind, params._valid(sq), None, win, True, recompute, bias_type,
                    bias, slopes, params._share,
                )  # fmt: skip
        if fmt == "thd":
            out = _unpack(out, bounds, q.shape[0])
        elif fmt == "sbhd":
            out = out.permute(2, 0, 1, 3).reshape(sq, b, -1)
        else:
            out = out.permute(0, 2, 1, 3).reshape(b, sq, -1)
        return (out, max_logit) if self.return_max_logit else out

    def _maskless(self, params, causal: bool, win, bias_type: str, recompute: bool, q, k) -> bool:
        """Whether a cached step needs no mask: a uniform step (every sequence at one length
        taking one count of tokens) with no padded query positions, no window, bias, sink or max
        logit, and a causal step of one query per sequence (its last key is its own) or over
        whole new sequences (s_q = s_kv)."""
        sq, skv = q.shape[2], k.shape[2]
        return (
            params._uniform
            and sq == params.max_seqlen_q
            and win == ((-1, 0) if causal else (-1, -1))
            and (not causal or sq == 1 or sq == skv)
            and bias_type == "no_bias"
            and self.softmax_type == "vanilla"
            and not self.return_max_logit
            and not recompute
            and (_GQA_KWARG or k.shape[1] == q.shape[1])
        )


class _CudnnAttentionOff:
    """torch's cuDNN attention off inside (the other backends as the user set them): an object,
    not torch's sdpa_kernel context, which costs ~25 us a call on the host (the decode step's
    attention is host-bound)."""

    def __enter__(self) -> None:
        if torch.compiler.is_compiling():
            self.ctx = sdpa_kernel(_CACHED_BACKENDS)
            self.ctx.__enter__()
            return
        self.ctx = None
        self.on = torch.backends.cuda.cudnn_sdp_enabled()
        if self.on:
            torch.backends.cuda.enable_cudnn_sdp(False)

    def __exit__(self, *exc) -> None:
        if self.ctx is not None:
            self.ctx.__exit__(*exc)
        elif self.on:
            torch.backends.cuda.enable_cudnn_sdp(True)


def _describe(x) -> str:
    return f"{x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__


def _group_size(group) -> int:
    return torch.distributed.get_world_size(group) if torch.distributed.is_initialized() else 1


def _pack(xs, cu: torch.Tensor, cu_pad: torch.Tensor | None, max_len: int | None):
    """One side's packed [t, h, d] tensors (q, or k and v) -> (each as [b, h, s, d], zeros past
    its sequence's end; valid [b, s]; (starts, lens, s), the bounds _unpack reads)."""
    x0 = xs[0]
    t = x0.shape[0]
    if cu.device.type == "cpu" and max_len is not None and int((cu[1:] - cu[:-1]).max()) > max_len:
        raise ValueError(
            f"DotProductAttention: max_seqlen_q / max_seqlen_kv: {max_len} is shorter than the longest "
            f"sequence, {int((cu[1:] - cu[:-1]).max())} tokens"
        )
    cu = cu.to(x0.device).long()
    starts = (cu if cu_pad is None else cu_pad.to(x0.device).long())[:-1]
    lens = cu[1:] - cu[:-1]
    if max_len is None:
        max_len = int(lens.max()) if lens.numel() else 0
    s = max(int(max_len), 1)
    pos = torch.arange(s, device=x0.device)
    valid = pos[None, :] < lens[:, None]  # [b, s]
    tok = (starts[:, None] + pos[None, :]).clamp(0, max(t - 1, 0))
    padded = [torch.where(valid[:, :, None, None], x[tok], x.new_zeros(())).permute(0, 2, 1, 3) for x in xs]
    return padded, valid, (starts, lens, s)


def _unpack(out: torch.Tensor, bounds, t: int) -> torch.Tensor:
    """[b, h, s, d_v] -> packed [t, h * d_v], zeros for tokens outside every sequence."""
    starts, lens, s = bounds
    # Where each packed token sits in the padded batch (tokens outside every sequence: nowhere).
    tok_ids = torch.arange(t, device=out.device)
    seq = (torch.searchsorted(starts.contiguous(), tok_ids, right=True) - 1).clamp(min=0)
    at = tok_ids - starts[seq]
    inside = (at >= 0) & (at < lens[seq])
    rows = out.permute(0, 2, 1, 3)[seq, at.clamp(0, s - 1)]  # [t, h, d_v]
    rows = torch.where(inside[:, None, None], rows, rows.new_zeros(()))
    return rows.reshape(t, -1)
