"""``te.MultiheadAttention``: TE's attention block: QKV projection (optionally after a norm),
rotary embedding, optional QK norms, te.DotProductAttention, the output projection.

Submodules and parameters carry TE's names, so a TE checkpoint's ``state_dict`` loads:
``layernorm_qkv`` (a te.LayerNormLinear, ``input_layernorm=True``) or ``qkv`` (a te.Linear) for
self attention; ``layernorm_query`` / ``query_layer`` and ``key_value`` for cross attention;
``q_norm`` / ``k_norm``; ``core_attention``; ``proj``.

QKV layout (TE's). The projection's output per token is h_q query heads, g key heads and g value
heads of d channels. With ``fuse_qkv_params=False`` (the default) they are separate parameters
(``query_weight``, ``key_weight``, ``value_weight``) and the output is [queries | keys | values].
With ``fuse_qkv_params=True`` one ``weight`` holds them, by default interleaved per key/value
group (``qkv_weight_interleaved``): for each group, its h_q / g query heads, then its key head,
then its value head, so a column split over tensor-parallel ranks gives each rank whole groups.
The GEMMs are te's modules (quantized inside te.autocast); the attention core runs in high
precision (te.DotProductAttention).
"""

from __future__ import annotations

import torch

from te_torch._dot_product_attention import DotProductAttention
from te_torch._inference import InferenceParams
from te_torch._layernorm_linear import LayerNormLinear
from te_torch._linear import Linear
from te_torch._module_base import (
    FLOAT_DTYPES,
    UNSUPPORTED_KWARGS,
    DropsTeExtraState,
    check_eps,
    check_size,
    reject_kwargs,
)
from te_torch._norm import LayerNorm, RMSNorm
from te_torch._rope import apply_cached, apply_rotary_pos_emb
from te_torch._tensor_parallel import parallel_config

__all__ = ["MultiheadAttention"]

QK_NORM_TYPES = (None, "L2Normalization", "RMSNorm", "LayerNorm")


class _L2Normalization(DropsTeExtraState, torch.nn.Module):
    """y = x / sqrt(sum(x^2) + eps) over the last dim (TE's L2Normalization; no parameters),
    computed in fp32."""

    def __init__(self, eps: float) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.square().sum(-1, keepdim=True) + self.eps)).to(x.dtype)


def _qk_norm(kind, d: int, eps: float, params_dtype, device):
    if kind == "L2Normalization":
        return _L2Normalization(eps)
    cls = RMSNorm if kind == "RMSNorm" else LayerNorm
    return cls(d, eps=eps, params_dtype=params_dtype, device=device)


class MultiheadAttention(torch.nn.Module):
    """TE's ``MultiheadAttention`` (self or cross attention) over te's modules.

    Args (TE's names and defaults; see TE's documentation for the rest):
        hidden_size: the input's (and output's) last dim.
        num_attention_heads: query heads h_q; ``kv_channels`` their dim (default hidden_size /
            h_q); ``num_gqa_groups`` key/value heads g (default h_q).
        attention_dropout: on the attention probabilities (0.1).
        layernorm_epsilon, normalization (``"LayerNorm"`` / ``"RMSNorm"``), zero_centered_gamma:
            the input norm's, with ``input_layernorm=True``.
        init_method, output_layer_init_method: the QKV and the output projection's weight init.
        attn_mask_type, window_size, bottom_right_diagonal, qkv_format, softmax_type: the
            attention core's defaults (te.DotProductAttention). ``qkv_format`` is also the input's
            layout: [s, b, hidden] (``"sbhd"``), [b, s, hidden] (``"bshd"``) or [t, hidden]
            (``"thd"``).
        attention_type: ``"self"`` or ``"cross"`` (keys and values from ``encoder_output``).
        fuse_qkv_params, qkv_weight_interleaved: the QKV parameters' layout (module docstring).
        rotary_pos_interleaved: the rotary embedding rotates channel pairs.
        qk_norm_type: None, ``"L2Normalization"``, ``"RMSNorm"`` or ``"LayerNorm"`` on each query
            and key head (eps ``qk_norm_eps``), after the rotary embedding unless
            ``qk_norm_before_rope``.
        return_bias: return the output projection's bias apart (not added).
        return_layernorm_output: also return the input norm's output.
        tp_group, tp_size, set_parallel_mode, sequence_parallel, get_rng_state_tracker,
            fuse_wgrad_accumulation, params_dtype, device, bias: as te.Linear's; with
            ``set_parallel_mode`` the QKV projection is column-split and the output projection
            row-split over ``tp_group``.
        layer_number: this layer's key in a KV cache (``inference_params``).
        seq_length, micro_batch_size, name: accepted.
    """

    def __init__(
        self,
        hidden_size: int,
        num_attention_heads: int,
        kv_channels: int | None = None,
        attention_dropout: float = 0.1,
        layernorm_epsilon: float = 1e-5,
        init_method=None,
        output_layer_init_method=None,
        layer_number: int | None = None,
        attn_mask_type: str = "causal",
        window_size: tuple[int, int] | None = None,
        bottom_right_diagonal: bool | None = None,
        tp_group=None,
        tp_size: int = 1,
        num_gqa_groups: int | None = None,
        fuse_wgrad_accumulation: bool = False,
        get_rng_state_tracker=None,
        sequence_parallel: bool = False,
        params_dtype: torch.dtype | None = None,
        return_bias: bool = False,
        return_layernorm_output: bool = False,
        input_layernorm: bool = False,
        attention_type: str = "self",
        set_parallel_mode: bool = False,
        fuse_qkv_params: bool = False,
        zero_centered_gamma: bool = False,
        qkv_weight_interleaved: bool = True,
        rotary_pos_interleaved: bool = False,
        bias: bool = True,
        normalization: str = "LayerNorm",
        device=None,
        qkv_format: str = "sbhd",
        name: str | None = None,
        qk_norm_type: str | None = None,
        qk_norm_eps: float = 1e-6,
        qk_norm_before_rope: bool = False,
        seq_length: int | None = None,
        micro_batch_size: int | None = None,
        softmax_type: str = "vanilla",
        **kwargs,
    ) -> None:
        super().__init__()
        owner = "MultiheadAttention"
        reject_kwargs(owner, kwargs, UNSUPPORTED_KWARGS)
        check_size(owner, "hidden_size", hidden_size)
        check_size(owner, "num_attention_heads", num_attention_heads)
        if kv_channels is None:
            if hidden_size % num_attention_heads:
                raise ValueError(
                    f"{owner}: kv_channels: not given, and num_attention_heads={num_attention_heads} "
                    f"does not divide hidden_size={hidden_size}"
                )
            kv_channels = hidden_size // num_attention_heads
        d = check_size(owner, "kv_channels", kv_channels)
        groups = (
            num_attention_heads
            if num_gqa_groups is None
            else check_size(owner, "num_gqa_groups", num_gqa_groups)
        )
        if attention_type not in ("self", "cross"):
            raise ValueError(f"{owner}: attention_type: expected 'self' or 'cross', got {attention_type!r}")
        if qk_norm_type not in QK_NORM_TYPES:
            raise ValueError(f"{owner}: qk_norm_type: expected one of {QK_NORM_TYPES}, got {qk_norm_type!r}")
        qk_norm_eps = check_eps(owner, qk_norm_eps)
        tp_group, tp_size, _, _ = parallel_config(owner, tp_group, tp_size, None, sequence_parallel)
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.num_gqa_groups = groups
        self.hidden_size_per_attention_head = d
        self.attention_type = attention_type
        self.input_layernorm = bool(input_layernorm)
        self.return_bias = bool(return_bias)
        self.return_layernorm_output = bool(return_layernorm_output)
        # TE's: the parameters' layout is concatenated whenever they are separate.
        self.qkv_weight_interleaved = bool(qkv_weight_interleaved) and bool(fuse_qkv_params)
        self.rotary_pos_interleaved = bool(rotary_pos_interleaved)
        self.qk_norm_before_rope = bool(qk_norm_before_rope)
        self.qkv_format = qkv_format
        self.layer_number = layer_number
        self.name = name
        # core_attention checks the head counts against tp_size and the format.
        self.core_attention = DotProductAttention(
            num_attention_heads,
            d,
            num_gqa_groups=groups,
            attention_dropout=attention_dropout,
            qkv_format=qkv_format,
            attn_mask_type=attn_mask_type,
            window_size=window_size,
            bottom_right_diagonal=bottom_right_diagonal,
            sequence_parallel=sequence_parallel,
            tp_size=tp_size,
            get_rng_state_tracker=get_rng_state_tracker,
            tp_group=tp_group,
            layer_number=layer_number,
            attention_type=attention_type,
            softmax_type=softmax_type,
            device=device,
        )
        self.heads = self.core_attention.heads
        self.kv_heads = self.core_attention.kv_heads
        hq, hkv = num_attention_heads * d, groups * d
        gemm = {
            "fuse_wgrad_accumulation": fuse_wgrad_accumulation,
            "tp_group": tp_group,
            "tp_size": tp_size,
            "get_rng_state_tracker": get_rng_state_tracker,
            "sequence_parallel": sequence_parallel,
            "params_dtype": params_dtype,
            "device": device,
            "bias": bias,
        }
        column = "column" if set_parallel_mode else None
        norm = {
            "eps": layernorm_epsilon,
            "normalization": normalization,
            "zero_centered_gamma": zero_centered_gamma,
            "return_layernorm_output": return_layernorm_output,
        }
        split = not fuse_qkv_params
        if attention_type == "self":
            parts = {"query": hq, "key": hkv, "value": hkv} if split else None
            if self.input_layernorm:
                self.layernorm_qkv = LayerNormLinear(
                    hidden_size, hq + 2 * hkv, init_method=init_method, parallel_mode=column,
                    parameters_split=parts, **norm, **gemm,
                )  # fmt: skip
            else:
                self.qkv = Linear(
                    hidden_size, hq + 2 * hkv, init_method=init_method, parallel_mode=column,
                    parameters_split=parts, **gemm,
                )  # fmt: skip
        else:
            if self.input_layernorm:
                self.layernorm_query = LayerNormLinear(
                    hidden_size, hq, init_method=init_method, parallel_mode=column,
                    parameters_split=("query",) if split else None, **norm, **gemm,
                )  # fmt: skip
            else:
                # TE's query_layer is one weight whatever fuse_qkv_params says
                self.query_layer = Linear(
                    hidden_size, hq, init_method=init_method, parallel_mode=column, **gemm
                )
            self.key_value = Linear(
                hidden_size, 2 * hkv, init_method=init_method, parallel_mode=column,
                parameters_split=("key", "value") if split else None, **gemm,
            )  # fmt: skip
        if qk_norm_type is not None:
            self.q_norm = _qk_norm(qk_norm_type, d, qk_norm_eps, params_dtype, device)
            self.k_norm = _qk_norm(qk_norm_type, d, qk_norm_eps, params_dtype, device)
        else:
            self.q_norm = self.k_norm = None
        self.proj = Linear(
            hq, hidden_size, init_method=output_layer_init_method, return_bias=return_bias,
            parallel_mode="row" if set_parallel_mode else None, **gemm,
        )  # fmt: skip

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask=None,
        encoder_output: torch.Tensor | None = None,
        attn_mask_type: str | None = None,
        window_size: tuple[int, int] | None = None,
        bottom_right_diagonal: bool | None = None,
        is_first_microbatch: bool | None = None,
        checkpoint_core_attention: bool = False,
        inference_params=None,
        rotary_pos_emb=None,
        core_attention_bias_type: str = "no_bias",
        core_attention_bias: torch.Tensor | None = None,
        alibi_slopes: torch.Tensor | None = None,
        cu_seqlens_q: torch.Tensor | None = None,
        cu_seqlens_kv: torch.Tensor | None = None,
        cu_seqlens_q_padded: torch.Tensor | None = None,
        cu_seqlens_kv_padded: torch.Tensor | None = None,
        max_seqlen_q: int | None = None,
        max_seqlen_kv: int | None = None,
        fast_zero_fill: bool = True,
        pad_between_seqs: bool | None = None,
    ):
        """Attention over ``hidden_states`` ([s, b, hidden] / [b, s, hidden] / [t, hidden] by
        ``qkv_format``; keys and values from ``encoder_output`` for cross attention).

        ``rotary_pos_emb``: angles [S, 1, 1, d'] (te.RotaryPositionEmbedding), or a (query, key)
        pair of them. ``inference_params``: a te.InferenceParams KV cache (self attention only;
        the module needs a ``layer_number``): this layer's cache is allocated at its first step,
        and the rotary angles start at each sequence's cached length. The other arguments go to
        te.DotProductAttention.forward.

        Returns the output (the input's shape), then the output projection's bias if
        ``return_bias``, then the input norm's output if ``input_layernorm`` and
        ``return_layernorm_output`` (a tuple when more than one).
        """
        owner = "MultiheadAttention"
        if inference_params is not None:
            if not isinstance(inference_params, InferenceParams):
                raise TypeError(
                    f"{owner}: inference_params: expected a te.InferenceParams, got "
                    f"{type(inference_params).__name__}"
                )
            if self.attention_type == "cross":
                raise ValueError(
                    f"{owner}: inference_params: a KV cache is for self attention (cross attention's keys "
                    "come from encoder_output every step)"
                )
            if self.layer_number is None:
                raise ValueError(
                    f"{owner}: layer_number: a KV cache (inference_params) keeps each layer's keys under "
                    "its layer_number; construct the module with one"
                )
            if self.layer_number not in inference_params.cache_manager.cache:
                inference_params.allocate_memory(self.layer_number)
        if not isinstance(hidden_states, torch.Tensor) or hidden_states.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{owner}: hidden_states: expected a float32, bfloat16 or float16 tensor")
        want = 2 if self.qkv_format == "thd" else 3
        if hidden_states.dim() != want or hidden_states.shape[-1] != self.hidden_size:
            raise ValueError(
                f"{owner}: hidden_states: expected {want} dims laid out {self.qkv_format} with the last "
                f"hidden_size={self.hidden_size}, got shape {tuple(hidden_states.shape)}"
            )
        ln_out = None
        lead = hidden_states.shape[:-1]
        d, h, g = self.hidden_size_per_attention_head, self.heads, self.kv_heads
        if self.attention_type == "self":
            if encoder_output is not None:
                raise ValueError(f"{owner}: encoder_output: given to self attention (attention_type='self')")
            if self.input_layernorm:
                mixed = self.layernorm_qkv(hidden_states, is_first_microbatch=is_first_microbatch)
                if self.return_layernorm_output:
                    mixed, ln_out = mixed
            else:
                mixed = self.qkv(hidden_states, is_first_microbatch=is_first_microbatch)
            per = h // g
            if self.qkv_weight_interleaved:
                q, k, v = mixed.view(*lead, g, per + 2, d).split((per, 1, 1), dim=-2)
            else:
                q, k, v = mixed.view(*lead, per + 2, g, d).split((per, 1, 1), dim=-3)
            q = q.reshape(*lead, h, d)
            k, v = k.reshape(*lead, g, d), v.reshape(*lead, g, d)
        else:
            if not isinstance(encoder_output, torch.Tensor) or encoder_output.dim() != want:
                raise ValueError(
                    f"{owner}: encoder_output: cross attention takes the keys' and values' source, a "
                    f"{want}-d tensor laid out {self.qkv_format}"
                )
            kv = self.key_value(encoder_output, is_first_microbatch=is_first_microbatch)
            kv_lead = encoder_output.shape[:-1]
            if self.qkv_weight_interleaved:
                k, v = kv.view(*kv_lead, g, 2 * d).split((d, d), dim=-1)
            else:
                k, v = kv.view(*kv_lead, 2 * g, d).split((g, g), dim=-2)
            if self.input_layernorm:
                q = self.layernorm_query(hidden_states, is_first_microbatch=is_first_microbatch)
                if self.return_layernorm_output:
                    q, ln_out = q
            else:
                q = self.query_layer(hidden_states, is_first_microbatch=is_first_microbatch)
            q = q.view(*lead, h, d)
        if self.q_norm is not None and self.qk_norm_before_rope:
            q, k = self.q_norm(q), self.k_norm(k)
        if rotary_pos_emb is not None:
            q_emb, k_emb = (
                rotary_pos_emb if isinstance(rotary_pos_emb, tuple) else (rotary_pos_emb, rotary_pos_emb)
            )
            fmt, inter = self.qkv_format, self.rotary_pos_interleaved
            if inference_params is not None:
                # The new tokens continue their sequences: positions count from the cached
                # lengths, checked here on the host (padded positions past freqs are masked).
                longest = inference_params.max_seqlen_kv
                for arg, emb in (("rotary_pos_emb", q_emb), ("rotary_pos_emb (key)", k_emb)):
                    if isinstance(emb, torch.Tensor) and emb.dim() == 4 and emb.shape[0] < longest:
                        raise ValueError(
                            f"{owner}: {arg}: a sequence in the KV cache reaches position {longest - 1}; "
                            f"expected angles for at least {longest} positions, got {emb.shape[0]}"
                        )
                b = inference_params.batch_size
                start = inference_params.get_seqlens_pre_step()[:b]
                cu = inference_params.cu_seqlens_q[: b + 1]
                q = apply_cached(q, q_emb, fmt, start, inter, cu)
                k = apply_cached(k, k_emb, fmt, start, inter, cu)
            else:
                # a thd sequence's positions count from where it starts in the packed tensor
                cu_q = cu_seqlens_q if cu_seqlens_q_padded is None else cu_seqlens_q_padded
                cu_kv = cu_seqlens_kv if cu_seqlens_kv_padded is None else cu_seqlens_kv_padded
                q = apply_rotary_pos_emb(q, q_emb, fmt, interleaved=inter, cu_seqlens=cu_q)
                k = apply_rotary_pos_emb(k, k_emb, fmt, interleaved=inter, cu_seqlens=cu_kv)
        if self.q_norm is not None and not self.qk_norm_before_rope:
            q, k = self.q_norm(q), self.k_norm(k)
        context = self.core_attention(
            q,
            k,
            v,
            attention_mask=attention_mask,
            cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_kv=cu_seqlens_kv,
            cu_seqlens_q_padded=cu_seqlens_q_padded,
            cu_seqlens_kv_padded=cu_seqlens_kv_padded,
            max_seqlen_q=max_seqlen_q,
            max_seqlen_kv=max_seqlen_kv,
            attn_mask_type=attn_mask_type,
            window_size=window_size,
            bottom_right_diagonal=bottom_right_diagonal,
            checkpoint_core_attention=checkpoint_core_attention,
            core_attention_bias_type=core_attention_bias_type,
            core_attention_bias=core_attention_bias,
            alibi_slopes=alibi_slopes,
            inference_params=inference_params,
        )
        out = self.proj(context, is_first_microbatch=is_first_microbatch)
        outputs = out if isinstance(out, tuple) else (out,)
        if self.input_layernorm and self.return_layernorm_output:
            outputs = (*outputs, ln_out)
        return outputs if len(outputs) > 1 else outputs[0]
