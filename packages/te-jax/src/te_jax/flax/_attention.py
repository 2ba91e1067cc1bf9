"""te_jax.flax's DotProductAttention and MultiHeadAttention: TE Flax's modules, names, parameters
and defaults.

The attention core (QK^T, mask, softmax, dropout, PV) is plain jax.numpy, TE-JAX's unfused path:
it stays in high precision under every recipe (te has no FP8 attention kernel yet; a recipe
with ``fp8_dpa`` / ``fp8_mha`` says so once at INFO). The projections around it are te_jax's
LayerNormDenseGeneral and DenseGeneral, so their GEMMs are quantized inside te_jax.autocast.

Layouts (b batch, s sequence, h heads, g KV heads (GQA groups), d head dim):
    bs3hd, t3hd                     query [b, s, 3, h, d] packs q, k, v; key = value = None
    bshd_bs2hd, thd_t2hd            query [b, s_q, h, d]; key [b, s_kv, 2, g, d] packs k, v;
                                    value = None
    bshd_bshd_bshd, thd_thd_thd     query [b, s_q, h, d]; key [b, s_kv, g, d];
                                    value [b, s_kv, g, d_v]
The THD layouts (TE-JAX's) pack several sequences per batch row, described by a
te_jax.attention.SequenceDescriptor; the BSHD ones hold one per row. With
``transpose_batch_sequence=True`` b and s swap places in every input and in the output.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from te_jax._attention import BIASES as _BIASES
from te_jax._attention import LAYOUTS as _LAYOUTS
from te_jax._attention import MASKS as _MASKS
from te_jax._attention import SOFTMAXES as _SOFTMAXES
from te_jax._attention import AttnBiasType as AttnBiasType
from te_jax._attention import AttnMaskType as AttnMaskType
from te_jax._attention import AttnSoftmaxType as AttnSoftmaxType
from te_jax._attention import QKVLayout as QKVLayout
from te_jax._attention import SequenceDescriptor, build_mask
from te_jax._attention import array as _array
from te_jax._attention import canonical as _canonical
from te_jax._attention import check_shape as _check_shape
from te_jax.flax import _common
from te_jax.flax._kv_cache import KVCache
from te_jax.flax._layers import DenseGeneral, LayerNormDenseGeneral, _not_supported

Initializer = Callable[..., Any]
_F32 = jnp.float32


_CP_STRATEGIES = ("DEFAULT", "ALL_GATHER", "ALLGATHER", "RING")
_told_fp8_attention = False


def _say_fp8_attention_once(recipe) -> None:
    global _told_fp8_attention
    if _told_fp8_attention or recipe is None:
        return
    if getattr(recipe, "fp8_dpa", False) or getattr(recipe, "fp8_mha", False):
        _told_fp8_attention = True
        logging.getLogger("te").info(
            "te_jax: recipe.fp8_dpa/fp8_mha is set, but te_jax has no FP8 attention: "
            "DotProductAttention runs in the inputs' precision (softmax in fp32); the "
            "projections' GEMMs stay quantized"
        )


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _check_heads(module, head_dim, heads, groups) -> int:
    """num_gqa_groups (None: num_attention_heads) after checking the three sizes."""
    owner = type(module).__name__
    for name, v in (("head_dim", head_dim), ("num_attention_heads", heads)):
        if not (_is_int(v) and v >= 1):
            raise ValueError(f"{owner}.{name}: expected an int >= 1, got {v!r}")
    g = heads if groups is None else groups
    if not (_is_int(g) and g >= 1 and heads % g == 0):
        raise ValueError(
            f"{owner}.num_gqa_groups: expected None or an int >= 1 dividing "
            f"num_attention_heads={heads}, got {groups!r}"
        )
    return int(g)


def _check_rate(module, name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value < 1.0:
        raise ValueError(f"{type(module).__name__}.{name}: expected a float in [0, 1), got {value!r}")
    return float(value)


def _check_window(module, window) -> tuple[int, int] | None:
    """window_size as (left, right) or None; a negative side is unbounded."""
    if window is None:
        return None
    if not (isinstance(window, (tuple, list)) and len(window) == 2 and all(_is_int(w) for w in window)):
        raise ValueError(
            f"{type(module).__name__}.window_size: expected None or (left, right) ints "
            f"(negative: unbounded), got {window!r}"
        )
    return int(window[0]), int(window[1])


def check_attention_args(module) -> tuple[float, tuple[int, int] | None, str, str]:
    """(attention_dropout, window_size, attn_mask_type, softmax_type) of an attention module,
    checked and canonical; errors name the module's attribute."""
    owner = type(module).__name__
    return (
        _check_rate(module, "attention_dropout", module.attention_dropout),
        _check_window(module, module.window_size),
        _canonical(module.attn_mask_type, _MASKS, f"{owner}.attn_mask_type"),
        _canonical(module.softmax_type, _SOFTMAXES, f"{owner}.softmax_type"),
    )


_PADDING_TYPES = ("padding", "padding_causal", "padding_causal_bottom_right")


def check_thd_mask_type(name: str, mask_type: str, thd: str) -> None:
    """TE's THD layouts take the padding mask types only (the segments are the padding)."""
    if mask_type not in _PADDING_TYPES:
        raise ValueError(
            f"{name}: {thd} (packed sequences) takes a padding mask type, one of {_PADDING_TYPES} "
            f"(as TE), got {mask_type!r}"
        )


def check_qkv_format(module, mask_attr: str) -> bool:
    """Whether MultiHeadAttention / TransformerLayer run THD (qkv_format 'thd'), after checking
    qkv_format and, for THD, the (self) attention's mask type, the attribute ``mask_attr``."""
    owner = type(module).__name__
    fmt = module.qkv_format
    if not (isinstance(fmt, str) and fmt.lower() in ("bshd", "thd")):
        raise ValueError(f"{owner}.qkv_format: expected 'bshd' or 'thd', got {fmt!r}")
    thd = fmt.lower() == "thd"
    if thd:
        mask_type = _canonical(getattr(module, mask_attr), _MASKS, f"{owner}.{mask_attr}")
        check_thd_mask_type(f"{owner}.{mask_attr}", mask_type, "qkv_format='thd'")
    return thd


def _masked_softmax(logits, masked, offset):
    """softmax over the last dim of fp32 ``logits`` [b, h, s_q, s_kv] without the entries where
    ``masked`` is True, plus exp(offset[h]) in the denominator when offset is given. A row with
    every entry masked gives zeros (and zero gradients), never NaN."""
    x = logits if masked is None else jnp.where(masked, -jnp.inf, logits)
    m = jnp.max(x, axis=-1, keepdims=True)
    off = None if offset is None else jnp.reshape(offset.astype(_F32), (1, -1, 1, 1))
    if off is not None:
        m = jnp.maximum(m, off)
    # the result does not depend on m: a constant for the gradient, 0 for a fully masked row
    m = jax.lax.stop_gradient(jnp.where(jnp.isfinite(m), m, 0.0))
    e = jnp.exp(x - m)
    denom = jnp.sum(e, axis=-1, keepdims=True)
    if off is not None:
        denom = denom + jnp.exp(off - m)
    return e / jnp.where(denom > 0, denom, 1.0)


class DotProductAttention(nn.Module):
    """softmax(scale * q k^T [+ bias], masked) v per head, TE Flax's DotProductAttention.

    Attributes (TE's names and defaults):
      head_dim: d, the q/k head size (q's and k's last dim).
      num_attention_heads: h, query heads.
      num_gqa_groups: g, key/value heads (None: h); must divide h (GQA; 1 is MQA).
      attention_dropout: dropout rate on the softmax probabilities (0.0), drawn from the flax
        rng stream ``dropout_rng_name`` ('dropout') when ``deterministic`` is False.
      attn_mask_type: 'no_mask' | 'padding' | 'causal' (default) | 'padding_causal' (also
        'causal_padding') | 'causal_bottom_right' | 'padding_causal_bottom_right' (and TE's
        other spellings). Causal masks are top-left aligned, query i sees keys j <= i, or
        bottom-right aligned, j <= i + s_kv - s_q, with s_q and s_kv the real (unpadded) lengths
        of the row (BSHD) or of the segment (THD). The padding types need ``mask`` or
        ``sequence_descriptor``; 'no_mask' and the non-padding causal types ignore them. THD
        layouts take the padding types only (TE's rule).
      attn_bias_type: None (default: 'post_scale_bias' when a bias is passed, else 'no_bias'),
        'no_bias', 'pre_scale_bias' (softmax(scale * (qk + bias))) or 'post_scale_bias'
        (softmax(scale * qk + bias)).
      float32_logits: compute q k^T in fp32 (False: in the inputs' dtype, as TE's unfused
        path). Masking, bias and softmax always run in fp32; the probabilities are cast to the
        inputs' dtype for the PV product (a no-op for fp32 inputs).
      qkv_layout: 'bs3hd' | 'bshd_bs2hd' | 'bshd_bshd_bshd' (default) | 't3hd' | 'thd_t2hd' |
        'thd_thd_thd'; see the module docstring.
      scale_factor: the logits' scale (None: 1 / sqrt(head_dim)).
      transpose_batch_sequence: None / False: [b, s, ...] inputs; True: [s, b, ...] (a
        SequenceDescriptor stays [b, ...]).
      window_size: None or (left, right): query i sees keys in [i - left, i + right] (shifted
        like the causal diagonal with the bottom-right types; positions within the segment under
        THD), a negative side unbounded; applied with every mask type.
      softmax_type: 'vanilla' (default) | 'off_by_one' (also 'off-by-one') | 'learnable'
        (parameter ``softmax_offset`` [h], initialised to 0, i.e. off-by-one at init).
      dtype: the parameters' dtype (float32).
      max_segments_per_seq: None or an int >= 1 (1), TE's bound on the segments per row for its
        cuDNN kernel; te's masks take any number of segments, so it is checked and not needed.
      context_parallel_strategy ('DEFAULT' | 'ALL_GATHER' | 'RING'): accepted for TE
        compatibility (context parallelism is not supported yet: context_parallel_axis,
        context_parallel_causal_load_balanced, score_mod and score_mod_bprop raise
        NotImplementedError when set), context_checkpoint_name unused.

    ``__call__(query, key, value, sequence_descriptor=None, bias=None, *, deterministic=False,
    mask=None)``: ``sequence_descriptor`` is a te_jax.attention.SequenceDescriptor or a mask;
    ``mask`` (TE's older spelling; pass one of the two) is boolean (or integer, nonzero = True),
    True means masked OUT, shape [b, 1, s_q, s_kv] (any dim may be 1; the head dim may also be
    h), BSHD layouts only. Under BSHD a descriptor marks padding (from_seqlens: the first
    seqlens tokens of each row are real; from_segment_ids_and_pos: the tokens with id != 0).
    THD layouts need a descriptor from from_segment_ids_and_pos or from_seqlens_and_offsets,
    [b, s_q] / [b, s_kv] like the inputs: a token attends to the tokens of its own segment only,
    and padding tokens (id 0, or outside every segment) output zeros. ``bias`` is
    [b, h, s_q, s_kv] (any dim may be 1; under THD it indexes the packed rows' tokens). Returns
    [b, s_q, h, d_v] in the query's dtype. A query that sees no key gets zeros (and zero
    gradients), never NaN.
    """

    head_dim: int
    num_attention_heads: int
    num_gqa_groups: int | None = None
    attention_dropout: float = 0.0
    attn_mask_type: str = "causal"
    attn_bias_type: str | None = None
    dtype: Any = jnp.float32
    dropout_rng_name: str = "dropout"
    float32_logits: bool = False
    qkv_layout: str = "bshd_bshd_bshd"
    scale_factor: float | None = None
    transpose_batch_sequence: bool | None = None
    window_size: tuple[int, int] | None = None
    max_segments_per_seq: int | None = 1
    context_parallel_causal_load_balanced: bool = False
    context_parallel_axis: str = ""
    context_parallel_strategy: str = "DEFAULT"
    context_checkpoint_name: str = "context"
    softmax_type: str = "vanilla"
    score_mod: Callable | None = None
    score_mod_bprop: Callable | None = None

    @nn.compact
    def __call__(
        self,
        query,
        key,
        value,
        sequence_descriptor=None,
        bias=None,
        *,
        deterministic: bool = False,
        mask=None,
        score_mod_tensors=None,
        score_mod_bprop_tensors=None,
    ):
        _not_supported(
            self,
            context_parallel_axis=self.context_parallel_axis,
            context_parallel_causal_load_balanced=self.context_parallel_causal_load_balanced,
        )
        for name, v in (
            ("score_mod", self.score_mod),
            ("score_mod_bprop", self.score_mod_bprop),
            ("score_mod_tensors", score_mod_tensors),
            ("score_mod_bprop_tensors", score_mod_bprop_tensors),
        ):
            if v is not None:
                raise NotImplementedError(f"DotProductAttention: {name} is not supported by te_jax yet")
        g = _check_heads(self, self.head_dim, self.num_attention_heads, self.num_gqa_groups)
        h, d = self.num_attention_heads, self.head_dim
        rate, window, mask_type, softmax = check_attention_args(self)
        layout = _canonical(self.qkv_layout, _LAYOUTS, "DotProductAttention.qkv_layout")
        if str(self.context_parallel_strategy).upper() not in _CP_STRATEGIES:
            raise ValueError(
                f"DotProductAttention.context_parallel_strategy: expected one of {_CP_STRATEGIES} "
                f"(any case), got {self.context_parallel_strategy!r}"
            )
        if self.max_segments_per_seq is not None and not (
            _is_int(self.max_segments_per_seq) and self.max_segments_per_seq >= 1
        ):
            raise ValueError(
                f"DotProductAttention.max_segments_per_seq: expected an int >= 1, got "
                f"{self.max_segments_per_seq!r}"
            )
        if QKVLayout(layout).is_thd():
            check_thd_mask_type("DotProductAttention.attn_mask_type", mask_type, f"qkv_layout={layout!r}")
        if self.scale_factor is not None and (
            isinstance(self.scale_factor, bool) or not isinstance(self.scale_factor, numbers.Real)
        ):
            raise TypeError(
                f"DotProductAttention.scale_factor: expected None or a float, got {self.scale_factor!r}"
            )
        scale = 1.0 / math.sqrt(d) if self.scale_factor is None else float(self.scale_factor)
        _common.check_param_dtype(self)
        recipe, _ = _common.active_plan()
        _say_fp8_attention_once(recipe)

        if sequence_descriptor is not None and mask is not None:
            raise ValueError("DotProductAttention: pass the mask as mask or as sequence_descriptor, not both")
        seq = mask if sequence_descriptor is None else sequence_descriptor
        if seq is not None and not isinstance(seq, (SequenceDescriptor, jax.Array, np.ndarray)):
            raise TypeError(
                "sequence_descriptor: expected a te_jax.attention.SequenceDescriptor or a boolean mask "
                f"[b, 1, s_q, s_kv], got {type(seq).__name__}"
            )

        q, k, v = self._split(query, key, value, layout, h, g, d)
        if self.transpose_batch_sequence:
            q, k, v = (jnp.swapaxes(t, 0, 1) for t in (q, k, v))
        b, sq, skv = q.shape[0], q.shape[1], k.shape[1]
        if k.shape[0] != b or v.shape[0] != b or v.shape[1] != skv:
            raise ValueError(
                f"key, value: expected batch {b} (the query's) and one sequence length, got key "
                f"{tuple(k.shape)}, value {tuple(v.shape)} in [b, s, heads, dim] order"
            )

        bias_type = self._bias_type(bias)
        if bias is not None:
            bias = _array(bias, "bias")
            _check_shape(bias, (b, h, sq, skv), "bias", "a shape broadcastable to [b, h, s_q, s_kv] =", True)
        masked = build_mask(seq, layout=layout, mask_type=mask_type, window=window, b=b, h=h, sq=sq, skv=skv)

        offset = None
        if softmax == "learnable":
            offset = _common.param(
                self, "softmax_offset", nn.initializers.zeros, (h,), self.dtype, (), "axes"
            )
        elif softmax == "off_by_one":
            offset = jnp.zeros((h,), _F32)

        in_dtype = q.dtype
        r = h // g
        qg = jnp.reshape(q, (b, sq, g, r, d))
        if self.float32_logits:
            qg, k = qg.astype(_F32), k.astype(_F32)
        logits = jnp.einsum("bqgrd,bkgd->bgrqk", qg, k).astype(_F32)
        logits = jnp.reshape(logits, (b, h, sq, skv))  # head j uses kv head j // r
        if bias_type == "pre_scale_bias":
            logits = (logits + bias.astype(_F32)) * scale
        elif bias_type == "post_scale_bias":
            logits = logits * scale + bias.astype(_F32)
        else:
            logits = logits * scale
        probs = _masked_softmax(logits, masked, offset)
        if not deterministic and rate > 0.0:
            rng = self.make_rng(self.dropout_rng_name)
            keep = jax.random.bernoulli(rng, 1.0 - rate, probs.shape)
            probs = jnp.where(keep, probs / (1.0 - rate), 0.0)
        probs = jnp.reshape(probs.astype(v.dtype), (b, g, r, sq, skv))
        out = jnp.einsum("bgrqk,bkgd->bqgrd", probs, v)
        out = jnp.reshape(out, (b, sq, h, v.shape[-1])).astype(in_dtype)
        return jnp.swapaxes(out, 0, 1) if self.transpose_batch_sequence else out

    def _split(self, query, key, value, layout, h, g, d):
        """(q [b, s_q, h, d], k [b, s_kv, g, d], v [b, s_kv, g, d_v]) of the layout's inputs
        (still in the inputs' batch/sequence order)."""
        sb = "[s, b, " if self.transpose_batch_sequence else "[b, s, "
        query = _array(query, "query")
        if QKVLayout(layout).is_qkvpacked():
            for name, t in (("key", key), ("value", value)):
                if t is not None:
                    raise ValueError(
                        f"{name}: qkv_layout={layout!r} packs q, k and v in query; expected {name}=None"
                    )
            if g != h:
                raise ValueError(
                    f"DotProductAttention.num_gqa_groups: qkv_layout={layout!r} packs as many k/v heads "
                    f"as q heads; expected None or {h}, got {g}"
                )
            _check_shape(query, (None, None, 3, h, d), "query", f"qkv_layout={layout!r}: {sb}3, h, d] =")
            q, k, v = (query[:, :, i] for i in range(3))
        elif QKVLayout(layout).is_kvpacked():
            if value is not None:
                raise ValueError(f"value: qkv_layout={layout!r} packs k and v in key; expected value=None")
            _check_shape(query, (None, None, h, d), "query", f"{sb}h, d] =")
            key = _array(key, "key")
            _check_shape(key, (None, None, 2, g, d), "key", f"qkv_layout={layout!r}: {sb}2, g, d] =")
            q, k, v = query, key[:, :, 0], key[:, :, 1]
        else:
            _check_shape(query, (None, None, h, d), "query", f"{sb}h, d] =")
            q, k, v = query, _array(key, "key"), _array(value, "value")
            _check_shape(k, (None, None, g, d), "key", f"{sb}g, d] =")
            _check_shape(v, (None, None, g, None), "value", f"{sb}g, d_v] =")
        for name, t in (("query", q), ("key", k), ("value", v)):
            if not jnp.issubdtype(t.dtype, jnp.floating) or t.dtype != q.dtype:
                raise TypeError(
                    f"{name}: expected a floating dtype equal to the query's ({q.dtype}), got {t.dtype}"
                )
        return q, k, v

    def _bias_type(self, bias) -> str:
        if self.attn_bias_type is None:
            return "no_bias" if bias is None else "post_scale_bias"
        kind = _canonical(self.attn_bias_type, _BIASES, "DotProductAttention.attn_bias_type")
        if (kind == "no_bias") != (bias is None):
            want = "bias=None" if kind == "no_bias" else "a bias array"
            raise ValueError(f"bias: attn_bias_type={kind!r} expects {want}, got {type(bias).__name__}")
        return kind


def _rotary(x, windows, seq_dim: int, group_method: str, start=0):
    """Rotary position embedding of x [..., s, ..., heads, d] (positions start..start+s-1 along
    ``seq_dim``; ``start`` may be traced), TE's: time scales min * (max / min) ** (2i / d),
    i < d / 2; 'alternate' rotates the pairs (i, i + d/2), 'consecutive' the pairs (2i, 2i + 1).
    Math in fp32."""
    d = x.shape[-1]
    lo, hi = float(windows[0]), float(windows[1])
    scales = lo * (hi / lo) ** (2.0 * jnp.arange(d // 2, dtype=_F32) / d)
    shape = [1] * x.ndim
    shape[seq_dim] = x.shape[seq_dim]
    pos = jnp.reshape(jnp.arange(x.shape[seq_dim], dtype=_F32) + jnp.asarray(start, _F32), shape)
    xf = x.astype(_F32)
    if group_method == "alternate":
        angle = pos / scales
        x1, x2 = xf[..., : d // 2], xf[..., d // 2 :]
        sin, cos = jnp.sin(angle), jnp.cos(angle)
        out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    else:
        angle = pos / jnp.repeat(scales, 2)
        sin, cos = jnp.sin(angle), jnp.cos(angle)
        pairs = jnp.reshape(xf, xf.shape[:-1] + (d // 2, 2))
        swapped = jnp.reshape(jnp.stack([-pairs[..., 1], pairs[..., 0]], axis=-1), xf.shape)
        out = xf * cos + swapped * sin
    return out.astype(x.dtype)


def _group_method(value) -> str:
    key = value.lower().strip().replace("-", "").replace("_", "") if isinstance(value, str) else None
    if key not in ("consecutive", "alternate"):
        raise ValueError(
            f"MultiHeadAttention.rotary_pos_emb_group_method: expected 'consecutive' or 'alternate', "
            f"got {value!r}"
        )
    return key


_LORA_SCOPES = (
    "none",
    "all",
    "qkv_proj",
    "output_proj",
    "mlp",
    "exclude_qkv_proj",
    "exclude_output_proj",
    "exclude_mlp",
)


def check_lora_scope(module, scope) -> None:
    """TE's low_rank_adaptation_scope: 'none' works, the others are not supported yet."""
    s = "none" if scope is None else scope
    if not isinstance(s, str) or s.lower() not in _LORA_SCOPES:
        raise ValueError(
            f"{type(module).__name__}.low_rank_adaptation_scope: expected one of {_LORA_SCOPES}, "
            f"got {scope!r}"
        )
    if s.lower() != "none":
        raise NotImplementedError(
            f"{type(module).__name__}: low_rank_adaptation_scope={scope!r} is not supported by te_jax yet"
        )


def default_mha_kernel_init():
    """TE's MultiHeadAttention / TransformerLayer projection init."""
    return nn.initializers.variance_scaling(1.0, "fan_in", "normal")


class MultiHeadAttention(nn.Module):
    """[LayerNorm] -> q, k, v projections -> [rotary] -> DotProductAttention -> out projection,
    TE Flax's MultiHeadAttention. Returns (out [b, s_q, hidden], ln_out): ln_out is the input
    norm's output with ``return_layernorm_output``, else None.

    Attributes (TE's names and defaults): head_dim, num_attention_heads, num_gqa_groups (None:
    as many as heads), attention_dropout (0.0), dropout_rng_name ('dropout'), input_layernorm
    (True), layernorm_type ('layernorm' | 'rmsnorm'), layernorm_epsilon (1e-6),
    return_layernorm_output (False), zero_centered_gamma (False), kernel_init (None:
    variance_scaling(1.0, 'fan_in', 'normal')), use_bias (False), bias_init (zeros),
    attn_mask_type ('causal'), attn_bias_type (None), enable_rotary_pos_emb (False),
    rotary_pos_emb_windows ((1, 10000)), rotary_pos_emb_group_method ('consecutive' |
    'alternate'), low_rank_adaptation_scope ('none'; others raise NotImplementedError),
    low_rank_adaptation_dim, low_rank_adaptation_alpha, dtype (the parameters'),
    fuse_qkv_params (True), transpose_batch_sequence (None: [b, s, hidden] inputs; True:
    [s, b, hidden]), enable_sequence_parallel (accepted; a sharding hint te_jax does not use),
    scale_attn_logits (False: logits are not scaled, the query kernel's init is divided by
    sqrt(head_dim) instead when scaled_query_init; True: DotProductAttention scales by
    1 / sqrt(head_dim)), scaled_query_init (True), float32_logits (False), window_size (None),
    softmax_type ('vanilla'). te adds ``qkv_format``: 'bshd' (default; TE's MultiHeadAttention)
    or 'thd': the rows of inputs_q / inputs_kv pack several sequences each, DotProductAttention
    runs 'thd_thd_thd' (the parameters do not change) and ``mask`` must be a SequenceDescriptor
    for them (see DotProductAttention); attn_mask_type must then be a padding type. Rotary
    embeddings rotate by the token's index in the row, which within a (contiguous) segment
    gives the segment's own relative rotations, so q k^T is the segment's.

    Parameters (TE's submodule names; N = heads * head_dim, G = num_gqa_groups * head_dim, H
    the input's hidden size): self attention (``inputs_q is inputs_kv``) without GQA and with
    fuse_qkv_params: ``qkv`` (LayerNormDenseGeneral, kernel [H, 3, N], q/k/v slices drawn
    apart); otherwise ``query`` (LayerNormDenseGeneral, kernel [H, N]) and, with
    fuse_qkv_params, ``kv`` (DenseGeneral, kernel [H, 2, G]) or else ``key`` and ``value``
    (DenseGeneral, kernels [H, G]); self attention's k/v read the query's norm output. ``out``
    (DenseGeneral, kernel [N, H]). softmax_type='learnable' adds ``DotProductAttention_0/
    softmax_offset`` [heads].

    ``__call__(inputs_q, inputs_kv, mask=None, bias=None, *, decode=False, deterministic=False)``:
    mask (a boolean mask or a te_jax.attention.SequenceDescriptor, passed on as
    DotProductAttention's ``sequence_descriptor``, as TE does) and bias as DotProductAttention's.

    ``decode=True``: autoregressive decoding with TE's KV cache in the flax collection
    ``"cache"`` (``cached_key`` / ``cached_value`` [b, L, g, d], [L, b, g, d] with
    transpose_batch_sequence, in the keys' dtype; ``cache_index`` int32; see _kv_cache.py).
    The first such call (model.init, or apply(..., mutable=["cache"]) without a cache) creates
    the cache for inputs of length L and returns the ordinary forward; each later call (apply
    with mutable=["cache"]) is a step of n >= 1 tokens per row, [b, n, hidden] (TE's take one):
    it writes their keys and values at cache_index..cache_index+n-1 (rotary embeddings rotate q
    and k at those positions), advances cache_index by n, and its query i attends to the tokens
    cached up to position cache_index+i (causal types; 'no_mask' / 'padding': up to the step's
    last token), within the window. In a step, ``bias`` is [b, h, 1 or n, L] or covers every
    query, [b, h, L, L] (TE's: rows cache_index..cache_index+n-1 are taken); ``mask``, read only
    by the padding mask types, likewise [b, 1, 1 or n or L, L]. qkv_format='thd' raises
    ValueError; so do a step of another batch size, one running past the cache's end (eagerly;
    a jitted one outputs NaN) and apply without mutable=["cache"].
    """

    head_dim: int
    num_attention_heads: int
    num_gqa_groups: int | None = None
    attention_dropout: float = 0.0
    dropout_rng_name: str = "dropout"
    input_layernorm: bool = True
    layernorm_type: str = "layernorm"
    layernorm_epsilon: float = 1e-6
    return_layernorm_output: bool = False
    zero_centered_gamma: bool = False
    kernel_init: Initializer | None = None
    use_bias: bool = False
    bias_init: Initializer = nn.initializers.zeros
    attn_mask_type: str = "causal"
    attn_bias_type: str | None = None
    enable_rotary_pos_emb: bool = False
    rotary_pos_emb_windows: tuple[int, int] = (1, 10000)
    rotary_pos_emb_group_method: str = "consecutive"
    low_rank_adaptation_scope: str = "none"
    low_rank_adaptation_dim: int = 32
    low_rank_adaptation_alpha: float | None = None
    dtype: Any = jnp.float32
    fuse_qkv_params: bool = True
    transpose_batch_sequence: bool | None = None
    enable_sequence_parallel: bool = False
    scale_attn_logits: bool = False
    scaled_query_init: bool = True
    float32_logits: bool = False
    window_size: tuple[int, int] | None = None
    softmax_type: str = "vanilla"
    score_mod: Callable | None = None
    score_mod_bprop: Callable | None = None
    qkv_format: str = "bshd"

    @nn.compact
    def __call__(
        self, inputs_q, inputs_kv, mask=None, bias=None, *, decode: bool = False, deterministic=False
    ):
        check_lora_scope(self, self.low_rank_adaptation_scope)
        thd = check_qkv_format(self, "attn_mask_type")
        if decode and thd:
            raise ValueError(
                "MultiHeadAttention.qkv_format: decode=True (the KV cache) takes 'bshd' (TE's decode "
                "runs bshd_bshd_bshd only), got 'thd'"
            )
        is_self = inputs_q is inputs_kv
        xq = _array(inputs_q, "inputs_q")
        xkv = xq if is_self else _array(inputs_kv, "inputs_kv")
        for name, t in (("inputs_q", xq), ("inputs_kv", xkv)):
            if t.ndim != 3:
                raise ValueError(
                    f"{name}: expected [batch, seq, hidden] (3 dims), got shape {tuple(t.shape)}"
                )
        if xkv.dtype != xq.dtype:
            raise TypeError(f"inputs_kv: expected inputs_q's dtype {xq.dtype}, got {xkv.dtype}")
        h, d = self.num_attention_heads, self.head_dim
        g = _check_heads(self, d, h, self.num_gqa_groups)
        _, window, mask_type, _ = check_attention_args(self)
        if self.enable_rotary_pos_emb:
            method = _group_method(self.rotary_pos_emb_group_method)
            w = self.rotary_pos_emb_windows
            if not (isinstance(w, (tuple, list)) and len(w) == 2 and all(
                isinstance(v, numbers.Real) and not isinstance(v, bool) and v > 0 for v in w
            )):  # fmt: skip
                raise ValueError(
                    "MultiHeadAttention.rotary_pos_emb_windows: expected (min, max) time scales > 0, "
                    f"got {w!r}"
                )
            if d % 2:
                raise ValueError(
                    f"MultiHeadAttention.head_dim: rotary position embedding rotates pairs; expected an "
                    f"even head_dim, got {d}"
                )
        cache = KVCache(self, xq, xkv, self.transpose_batch_sequence) if decode else None
        kernel_init = self.kernel_init or default_mha_kernel_init()

        def query_init(key, shape, dtype=jnp.float32):
            w = kernel_init(key, shape, dtype)
            return w / jnp.sqrt(jnp.asarray(d, dtype)) if self.scaled_query_init else w

        def stacked(inits):
            def init(key, shape, dtype=jnp.float32):
                keys = jax.random.split(key, len(inits))
                two_d = (shape[0], shape[-1])
                return jnp.stack([f(k, two_d, dtype) for f, k in zip(inits, keys, strict=True)], axis=-2)

            return init

        ln = dict(
            enable_layernorm=self.input_layernorm,
            layernorm_type=self.layernorm_type,
            epsilon=self.layernorm_epsilon,
            zero_centered_gamma=self.zero_centered_gamma,
            use_bias=self.use_bias,
            bias_init=self.bias_init,
            dtype=self.dtype,
            transpose_batch_sequence=bool(self.transpose_batch_sequence),
        )
        dense = dict(
            use_bias=self.use_bias,
            bias_init=self.bias_init,
            dtype=self.dtype,
            transpose_batch_sequence=bool(self.transpose_batch_sequence),
        )
        lead = xq.shape[:2]
        packed = self.fuse_qkv_params and is_self and g == h
        if packed:
            qkv, ln_out = LayerNormDenseGeneral(
                features=(3, h * d),
                kernel_init=stacked((query_init, kernel_init, kernel_init)),
                return_layernorm_output=self.return_layernorm_output,
                name="qkv",
                **ln,
            )(xq)
            qkv = jnp.reshape(qkv, lead + (3, h, d))
            q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        else:
            q, ln_out = LayerNormDenseGeneral(
                features=h * d,
                kernel_init=query_init,
                return_layernorm_output=self.return_layernorm_output or is_self,
                name="query",
                **ln,
            )(xq)
            q = jnp.reshape(q, lead + (h, d))
            kv_in = ln_out if is_self else xkv
            kv_lead = kv_in.shape[:2]
            if self.fuse_qkv_params:
                kv = DenseGeneral(
                    features=(2, g * d),
                    kernel_init=stacked((kernel_init, kernel_init)),
                    name="kv",
                    **dense,
                )(kv_in)
                kv = jnp.reshape(kv, kv_lead + (2, g, d))
                k, v = kv[:, :, 0], kv[:, :, 1]
            else:
                k, v = (
                    jnp.reshape(
                        DenseGeneral(
                            features=g * d,
                            kernel_init=kernel_init,
                            name=name,
                            **dense,
                        )(kv_in),
                        kv_lead + (g, d),
                    )
                    for name in ("key", "value")
                )
        if self.enable_rotary_pos_emb:
            seq_dim = 0 if self.transpose_batch_sequence else 1
            start = 0 if cache is None else cache.position
            q = _rotary(q, self.rotary_pos_emb_windows, seq_dim, method, start)
            k = _rotary(k, self.rotary_pos_emb_windows, seq_dim, method, start)
        dpa_mask_type, dpa_window = self.attn_mask_type, self.window_size
        if cache is not None:
            k, v = cache.update(k, v, "inputs_q" if is_self else "inputs_kv")
            if cache.filled:
                b = xq.shape[1 if self.transpose_batch_sequence else 0]
                mask = cache.step_mask(mask, mask_type, window, b, h)
                bias = cache.step_bias(bias, b, h)
                # the step's mask already holds the causal part and the window, at its position
                dpa_mask_type, dpa_window = "padding", None
        x = DotProductAttention(
            head_dim=d,
            num_attention_heads=h,
            num_gqa_groups=g,
            attention_dropout=self.attention_dropout,
            attn_mask_type=dpa_mask_type,
            attn_bias_type=self.attn_bias_type,
            dtype=self.dtype,
            dropout_rng_name=self.dropout_rng_name,
            float32_logits=self.float32_logits,
            qkv_layout="thd_thd_thd" if thd else "bshd_bshd_bshd",
            scale_factor=1.0 / math.sqrt(d) if self.scale_attn_logits else 1.0,
            transpose_batch_sequence=self.transpose_batch_sequence,
            window_size=dpa_window,
            softmax_type=self.softmax_type,
            score_mod=self.score_mod,
            score_mod_bprop=self.score_mod_bprop,
        )(q, k, v, mask, bias, deterministic=deterministic)
        x = jnp.reshape(x, lead + (h * d,))
        out = DenseGeneral(
            features=xq.shape[-1],
            kernel_init=kernel_init,
            name="out",
            **dense,
        )(x)
        if cache is not None:
            out = cache.guard(out)
        return out, (ln_out if self.return_layernorm_output else None)
