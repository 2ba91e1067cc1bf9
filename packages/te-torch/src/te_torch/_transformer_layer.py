"""``te.TransformerLayer``: TE's Transformer block over te's modules.

Pre-norm (the default), with x the input:

    a = x + dropout(self_attention(x) + proj bias)          self_attention: te.MultiheadAttention
    c = a + dropout(inter_attention(a, encoder_output) + b)   decoder layers only (cross attention)
    y = c + dropout(layernorm_mlp(c) + fc2 bias)              layernorm_mlp: te.LayerNormMLP

with each norm fused into the GEMM after it. ``apply_residual_connection_post_layernorm`` takes the
norm's output as the residual instead of its input; ``output_layernorm`` moves the first norm to
the output (BERT: y = norm(...), no input norm); ``parallel_attention_mlp`` runs attention and MLP
on the same input (y = x + dropout(attention(x) + mlp(x))); ``drop_path_rate`` drops a sample's
residual branches (stochastic depth; per sample along the batch dim, where TE draws along the
first dim; the cross attention's branch is never dropped, as in TE). Submodule names are TE's
(``self_attention``, ``inter_attention``, ``layernorm_mlp``, ``layernorm``), so TE checkpoints
load.
"""

from __future__ import annotations

import numbers

import torch

from te_torch._layernorm_mlp import LayerNormMLP
from te_torch._module_base import check_size, reject_kwargs
from te_torch._multihead_attention import MultiheadAttention
from te_torch._norm import LayerNorm, RMSNorm

__all__ = ["TransformerLayer"]

LAYER_TYPES = ("encoder", "decoder")
# TE's Userbuffers flags only act with ub_tp_comm_overlap, which te does not implement.
_UB_FLAGS = (
    "ub_overlap_ag",
    "ub_overlap_rs",
    "ub_overlap_rs_dgrad",
    "ub_bulk_dgrad",
    "ub_bulk_wgrad",
    "ub_name",
)


def _probability(owner: str, arg: str, p) -> float:
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not (0 <= p < 1):
        raise ValueError(f"{owner}: {arg}: expected a probability in [0, 1), got {p!r}")
    return float(p)


class TransformerLayer(torch.nn.Module):
    """TE's ``TransformerLayer``: self attention (+ cross attention in a decoder) and an MLP, each
    with its residual connection (module docstring).

    Args (TE's names and defaults): hidden_size, ffn_hidden_size, num_attention_heads,
    num_gqa_groups, kv_channels, layernorm_epsilon, normalization, zero_centered_gamma,
    hidden_dropout (on each branch before its residual add), attention_dropout, init_method,
    output_layer_init_method, activation / activation_params (te.LayerNormMLP's), bias,
    self_attn_mask_type / window_size / bottom_right_diagonal (the self attention's mask
    defaults), enc_dec_attn_mask_type / enc_dec_window_size / enc_dec_bottom_right_diagonal
    (the cross attention's), layer_type (``"encoder"`` or ``"decoder"``), attn_input_format (the
    layout: ``"sbhd"`` [s, b, hidden], ``"bshd"`` [b, s, hidden] or ``"thd"`` [t, hidden]),
    fuse_qkv_params / qkv_weight_interleaved / rotary_pos_interleaved / qk_norm_* / softmax_type
    (te.MultiheadAttention's), apply_residual_connection_post_layernorm, output_layernorm,
    parallel_attention_mlp, drop_path_rate, tp_group / tp_size / sequence_parallel /
    set_parallel_mode (the attention's QKV and FC1 column-split, the projections row-split),
    get_rng_state_tracker, fuse_wgrad_accumulation, params_dtype, device; layer_number,
    seq_length, micro_batch_size, name: accepted. ``ub_tp_comm_overlap`` (Userbuffers):
    NotImplementedError; the other ``ub_*`` flags only act with it, as in TE.
    """

    def __init__(
        self,
        hidden_size: int,
        ffn_hidden_size: int,
        num_attention_heads: int,
        num_gqa_groups: int | None = None,
        layernorm_epsilon: float = 1e-5,
        hidden_dropout: float = 0.1,
        attention_dropout: float = 0.1,
        init_method=None,
        output_layer_init_method=None,
        layer_number: int | None = None,
        kv_channels: int | None = None,
        self_attn_mask_type: str = "causal",
        window_size: tuple[int, int] | None = None,
        bottom_right_diagonal: bool | None = None,
        enc_dec_attn_mask_type: str = "no_mask",
        enc_dec_window_size: tuple[int, int] | None = None,
        enc_dec_bottom_right_diagonal: bool | None = None,
        tp_group=None,
        tp_size: int = 1,
        params_dtype: torch.dtype | None = None,
        get_rng_state_tracker=None,
        fuse_wgrad_accumulation: bool = False,
        seq_length: int | None = None,
        micro_batch_size: int | None = None,
        sequence_parallel: bool = False,
        apply_residual_connection_post_layernorm: bool = False,
        output_layernorm: bool = False,
        parallel_attention_mlp: bool = False,
        layer_type: str = "encoder",
        drop_path_rate: float = 0.0,
        set_parallel_mode: bool = False,
        fuse_qkv_params: bool = False,
        rotary_pos_interleaved: bool = False,
        zero_centered_gamma: bool = False,
        qkv_weight_interleaved: bool = True,
        ub_tp_comm_overlap: bool = False,
        bias: bool = True,
        activation: str = "gelu",
        activation_params: dict | None = None,
        normalization: str = "LayerNorm",
        device=None,
        attn_input_format: str = "sbhd",
        name: str | None = None,
        qk_norm_type: str | None = None,
        qk_norm_eps: float = 1e-6,
        qk_norm_before_rope: bool = False,
        softmax_type: str = "vanilla",
        **kwargs,
    ) -> None:
        super().__init__()
        owner = "TransformerLayer"
        if ub_tp_comm_overlap:
            raise NotImplementedError(
                f"{owner}: ub_tp_comm_overlap (Userbuffers) is not implemented in te yet"
            )
        reject_kwargs(owner, {k: v for k, v in kwargs.items() if k not in _UB_FLAGS})
        check_size(owner, "hidden_size", hidden_size)
        check_size(owner, "ffn_hidden_size", ffn_hidden_size)
        if layer_type not in LAYER_TYPES:
            raise ValueError(f"{owner}: layer_type: expected one of {LAYER_TYPES}, got {layer_type!r}")
        if parallel_attention_mlp and (
            apply_residual_connection_post_layernorm or output_layernorm or layer_type == "decoder"
        ):
            raise ValueError(
                f"{owner}: parallel_attention_mlp: runs the attention and the MLP on the same input, so it "
                "takes neither apply_residual_connection_post_layernorm, output_layernorm nor a decoder layer"
            )
        self.hidden_dropout = _probability(owner, "hidden_dropout", hidden_dropout)
        self.drop_path_rate = _probability(owner, "drop_path_rate", drop_path_rate)
        if self.drop_path_rate and attn_input_format == "thd":
            raise NotImplementedError(
                f"{owner}: drop_path_rate with attn_input_format='thd' (a packed batch's samples) is not "
                "implemented in te yet"
            )
        self.layer_type = layer_type
        self.apply_residual_connection_post_layernorm = bool(apply_residual_connection_post_layernorm)
        self.output_layernorm = bool(output_layernorm)
        self.parallel_attention_mlp = bool(parallel_attention_mlp)
        self.self_attn_mask_type = self_attn_mask_type
        self.enc_dec_attn_mask_type = enc_dec_attn_mask_type
        self.attn_input_format = attn_input_format
        self.layer_number = layer_number
        self.name = name
        attention = {
            "kv_channels": kv_channels,
            "attention_dropout": attention_dropout,
            "layernorm_epsilon": layernorm_epsilon,
            "init_method": init_method,
            "output_layer_init_method": output_layer_init_method,
            "layer_number": layer_number,
            "tp_group": tp_group,
            "tp_size": tp_size,
            "num_gqa_groups": num_gqa_groups,
            "fuse_wgrad_accumulation": fuse_wgrad_accumulation,
            "get_rng_state_tracker": get_rng_state_tracker,
            "sequence_parallel": sequence_parallel,
            "params_dtype": params_dtype,
            "return_layernorm_output": self.apply_residual_connection_post_layernorm,
            "set_parallel_mode": set_parallel_mode,
            "fuse_qkv_params": fuse_qkv_params,
            "zero_centered_gamma": zero_centered_gamma,
            "qkv_weight_interleaved": qkv_weight_interleaved,
            "rotary_pos_interleaved": rotary_pos_interleaved,
            "bias": bias,
            "normalization": normalization,
            "device": device,
            "qkv_format": attn_input_format,
            "qk_norm_type": qk_norm_type,
            "qk_norm_eps": qk_norm_eps,
            "qk_norm_before_rope": qk_norm_before_rope,
            "softmax_type": softmax_type,
        }
        self.self_attention = MultiheadAttention(
            hidden_size,
            num_attention_heads,
            attn_mask_type=self_attn_mask_type,
            window_size=window_size,
            bottom_right_diagonal=bottom_right_diagonal,
            input_layernorm=not self.output_layernorm,
            attention_type="self",
            return_bias=not self.parallel_attention_mlp,
            **attention,
        )
        if layer_type == "decoder":
            self.inter_attention = MultiheadAttention(
                hidden_size,
                num_attention_heads,
                attn_mask_type=enc_dec_attn_mask_type,
                window_size=enc_dec_window_size,
                bottom_right_diagonal=enc_dec_bottom_right_diagonal,
                input_layernorm=True,
                attention_type="cross",
                return_bias=True,
                **attention,
            )
        self.layernorm_mlp = LayerNormMLP(
            hidden_size,
            ffn_hidden_size,
            eps=layernorm_epsilon,
            fuse_wgrad_accumulation=fuse_wgrad_accumulation,
            tp_group=tp_group,
            tp_size=tp_size,
            get_rng_state_tracker=get_rng_state_tracker,
            init_method=init_method,
            output_layer_init_method=output_layer_init_method,
            bias=bias,
            normalization=normalization,
            activation=activation,
            activation_params=activation_params,
            return_bias=not self.parallel_attention_mlp,
            params_dtype=params_dtype,
            return_layernorm_output=self.apply_residual_connection_post_layernorm,
            sequence_parallel=sequence_parallel,
            set_parallel_mode=set_parallel_mode,
            zero_centered_gamma=zero_centered_gamma,
            device=device,
        )
        if self.output_layernorm:
            norm = RMSNorm if normalization == "RMSNorm" else LayerNorm
            self.layernorm = norm(
                hidden_size,
                eps=layernorm_epsilon,
                params_dtype=params_dtype,
                zero_centered_gamma=zero_centered_gamma,
                device=device,
            )

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask=None,
        self_attn_mask_type: str | None = None,
        window_size: tuple[int, int] | None = None,
        bottom_right_diagonal: bool | None = None,
        encoder_output: torch.Tensor | None = None,
        enc_dec_attn_mask=None,
        enc_dec_attn_mask_type: str | None = None,
        enc_dec_window_size: tuple[int, int] | None = None,
        enc_dec_bottom_right_diagonal: bool | None = None,
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
    ) -> torch.Tensor:
        """The layer's output, the input's shape and dtype. ``attention_mask``, the mask type,
        window and bias arguments, ``rotary_pos_emb`` and the ``cu_seqlens_*`` go to the self
        attention (te.MultiheadAttention.forward); ``encoder_output``, ``enc_dec_attn_mask`` and
        the ``enc_dec_*`` ones to a decoder's cross attention, which also takes the bias
        arguments (as in TE)."""
        seq = {
            "cu_seqlens_q": cu_seqlens_q,
            "cu_seqlens_kv": cu_seqlens_kv,
            "cu_seqlens_q_padded": cu_seqlens_q_padded,
            "cu_seqlens_kv_padded": cu_seqlens_kv_padded,
            "max_seqlen_q": max_seqlen_q,
            "max_seqlen_kv": max_seqlen_kv,
        }
        attn = self.self_attention(
            hidden_states,
            attention_mask=attention_mask,
            attn_mask_type=self_attn_mask_type,
            window_size=window_size,
            bottom_right_diagonal=bottom_right_diagonal,
            is_first_microbatch=is_first_microbatch,
            checkpoint_core_attention=checkpoint_core_attention,
            inference_params=inference_params,
            rotary_pos_emb=rotary_pos_emb,
            core_attention_bias_type=core_attention_bias_type,
            core_attention_bias=core_attention_bias,
            alibi_slopes=alibi_slopes,
            **seq,
        )
        if self.parallel_attention_mlp:
            mlp = self.layernorm_mlp(hidden_states, is_first_microbatch=is_first_microbatch)
            out = self._residual(attn + mlp, None, hidden_states)
        else:
            residual = hidden_states
            if self.apply_residual_connection_post_layernorm and not self.output_layernorm:
                attn, bias, residual = attn
            else:
                attn, bias = attn
            x = self._residual(attn, bias, residual)
            if self.layer_type == "decoder":
                cross = self.inter_attention(
                    x,
                    attention_mask=enc_dec_attn_mask,
                    encoder_output=encoder_output,
                    attn_mask_type=enc_dec_attn_mask_type,
                    window_size=enc_dec_window_size,
                    bottom_right_diagonal=enc_dec_bottom_right_diagonal,
                    is_first_microbatch=is_first_microbatch,
                    checkpoint_core_attention=checkpoint_core_attention,
                    core_attention_bias_type=core_attention_bias_type,
                    core_attention_bias=core_attention_bias,
                    alibi_slopes=alibi_slopes,
                )
                residual = x
                if self.apply_residual_connection_post_layernorm:
                    cross, bias, residual = cross
                else:
                    cross, bias = cross
                x = self._residual(cross, bias, residual, drop_path=False)  # as TE: no drop path here
            mlp = self.layernorm_mlp(x, is_first_microbatch=is_first_microbatch)
            residual = x
            if self.apply_residual_connection_post_layernorm:
                mlp, bias, residual = mlp
            else:
                mlp, bias = mlp
            out = self._residual(mlp, bias, residual)
        if self.output_layernorm:
            out = self.layernorm(out)
        return out

    def _residual(
        self, branch: torch.Tensor, bias, residual: torch.Tensor, drop_path: bool = True
    ) -> torch.Tensor:
        """residual + drop_path(dropout(branch + bias))."""
        if bias is not None and bias.numel():
            branch = branch + bias
        if not self.training:
            return residual + branch
        branch = torch.nn.functional.dropout(branch, p=self.hidden_dropout, training=True)
        if drop_path and self.drop_path_rate > 0:
            keep = 1.0 - self.drop_path_rate
            bdim = 1 if self.attn_input_format == "sbhd" else 0
            shape = [1] * branch.dim()
            shape[bdim] = branch.shape[bdim]
            sample = torch.empty(shape, dtype=branch.dtype, device=branch.device).bernoulli_(keep)
            branch = branch * sample / keep
        return residual + branch
