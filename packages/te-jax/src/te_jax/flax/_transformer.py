"""te_jax.flax's TransformerLayer (and its T5 RelativePositionBiases): TE Flax's module, names,
parameters and defaults, over MultiHeadAttention, LayerNormMLP and LayerNorm.

One layer, pre-LN by default (x: [b, s, hidden], or [s, b, hidden] with
transpose_batch_sequence):
    a = x + drop(attention(LN(x)))            residual from LN(x) instead with
    a = a + drop(cross_attention(LN(a), enc)) apply_residual_connection_post_layernorm
    y = a + drop(mlp(LN(a)))                  (DECODER only: the cross attention)
    y = LN(y) with output_layernorm (then the self attention has no input norm)
drop = hidden dropout, then drop_path (stochastic depth: one draw per sample) after the self
attention and the MLP; inside the MLP, intermediate dropout on the activations before FC2.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from te_jax.flax import _common
from te_jax.flax._attention import (
    MultiHeadAttention,
    _check_heads,
    _check_rate,
    check_lora_scope,
    check_qkv_format,
)
from te_jax.flax._kv_cache import CACHE_COLLECTION, cache_length
from te_jax.flax._layers import LayerNorm
from te_jax.flax._mlp import LayerNormMLP

Initializer = Callable[..., Any]


class TransformerLayerType(enum.Enum):
    """ENCODER: self attention and MLP; DECODER: self attention, cross attention over
    ``encoded``, MLP."""

    ENCODER = "encoder"
    DECODER = "decoder"


class RelativePositionBiases(nn.Module):
    """T5's relative position bias, TE Flax's RelativePositionBiases: a learned scalar per head
    and per bucket of the key-query distance (exact up to num_buckets / 4 (bidirectional) or
    num_buckets / 2, log-spaced up to max_distance, the last bucket beyond).

    Attributes: num_buckets, max_distance, num_attention_heads, embedding_init
    (flax.linen.linear.default_embed_init), embedding_axes (("heads", "relpos_buckets")), dtype.
    Parameter ``rel_embedding`` [heads, num_buckets].
    ``__call__(q_seqlen, k_seqlen, bidirectional=True)`` returns [1, heads, q_seqlen, k_seqlen].
    """

    num_buckets: int
    max_distance: int
    num_attention_heads: int
    embedding_init: Initializer = nn.linear.default_embed_init
    embedding_axes: tuple[str, ...] = ("heads", "relpos_buckets")
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, q_seqlen, k_seqlen, bidirectional=True):
        for name in ("num_buckets", "max_distance", "num_attention_heads"):
            _common.check_size(self, name, getattr(self, name), allow_tuple=False)
        n = self.num_buckets // 2 if bidirectional else self.num_buckets
        exact = n // 2
        if exact < 1 or self.max_distance <= exact:
            raise ValueError(
                f"RelativePositionBiases: expected num_buckets >= {4 if bidirectional else 2} and "
                f"max_distance > the exact buckets ({exact}), got num_buckets={self.num_buckets}, "
                f"max_distance={self.max_distance}"
            )
        # distance of query i to key j, counted backwards (i - j), in numpy: static shapes
        dist = np.arange(q_seqlen)[:, None] - np.arange(k_seqlen)[None, :]
        bucket = np.zeros(dist.shape, np.int32)
        if bidirectional:
            bucket += (dist < 0).astype(np.int32) * n
            dist = np.abs(dist)
        else:
            dist = np.maximum(dist, 0)
        far = exact + (
            np.log(dist.astype(np.float32) / exact + np.finfo(np.float32).eps)
            / np.log(self.max_distance / exact)
            * (n - exact)
        ).astype(np.int32)
        bucket += np.where(dist < exact, dist, np.minimum(far, n - 1))
        table = _common.param(
            self,
            "rel_embedding",
            self.embedding_init,
            (self.num_attention_heads, self.num_buckets),
            self.dtype,
            self.embedding_axes,
            "embedding_axes",
        )
        return jnp.take(table, jnp.asarray(bucket), axis=1)[None]


def _check_dims(module, name: str, dims, ndim: int) -> tuple[int, ...]:
    if not isinstance(dims, Sequence) or isinstance(dims, str) or not all(
        isinstance(d, (int, np.integer)) and not isinstance(d, bool) and -ndim <= d < ndim for d in dims
    ):  # fmt: skip
        raise ValueError(
            f"{type(module).__name__}.{name}: expected a tuple of dims of the [b, s, hidden] "
            f"activations (broadcast one dropout draw along them), got {dims!r}"
        )
    return tuple(int(d) for d in dims)


class TransformerLayer(nn.Module):
    """Self attention [+ cross attention] + MLP with residuals, TE Flax's TransformerLayer
    (see the module docstring for the wiring). Returns [b, s, hidden] in the input's dtype.

    Attributes (TE's names and defaults): hidden_size (512), mlp_hidden_size (2048),
    num_attention_heads (8; head_dim = hidden_size / num_attention_heads), num_gqa_groups
    (None), layernorm_type ('layernorm' | 'rmsnorm'), layernorm_epsilon (1e-6),
    zero_centered_gamma (False), hidden_dropout (0.1) and hidden_dropout_dims (()),
    attention_dropout (0.1), intermediate_dropout (0.1: the MLP's dropout on its activations'
    output before FC2, LayerNormMLP's intermediate_dropout_rate) and intermediate_dropout_dims
    (()), dropout_rng_name ('dropout': the stream of every dropout here), mha_kernel_init
    (None: variance_scaling(1.0, 'fan_in', 'normal')), mlp_kernel_init (None:
    variance_scaling(1.0, 'fan_in', 'truncated_normal')), mlp_activations (('relu',)),
    mlp_activation_params (None only), use_bias (False),
    bias_init (zeros), apply_residual_connection_post_layernorm (False), output_layernorm
    (False), float32_attention_logits (False), layer_type (TransformerLayerType.ENCODER),
    self_attn_mask_type ('causal'), self_attn_bias_type (None), enable_relative_embedding
    (True: T5 relative position biases, added to the self attention's logits after scaling),
    relative_embedding (None: RelativePositionBiases(32 buckets, max_distance 128) named
    ``relpos_bias``), enable_rotary_pos_emb (False), rotary_pos_emb_windows ((1, 10000)),
    rotary_pos_emb_group_method ('consecutive'), low_rank_adaptation_scope ('none'), dtype
    (the parameters'), drop_path (0.0), fuse_qkv_params (True), transpose_batch_sequence
    (False), enable_sequence_parallel (accepted, unused), scale_attn_logits (False),
    scaled_query_init (True), window_size (None), softmax_type ('vanilla'). te adds
    ``qkv_format`` ('bshd' default, or 'thd': packed sequences, MultiHeadAttention's; the self
    attention's mask type must then be a padding type, and the masks SequenceDescriptors).

    Submodules (TE's names): ``attention`` (ENCODER) or ``self_attention`` (DECODER) and
    ``encoder_decoder_attention`` (DECODER: attn_mask_type 'padding', no bias), MultiHeadAttention;
    ``mlp``, LayerNormMLP; ``relpos_bias``; ``output_layernorm``, LayerNorm.

    ``__call__(inputs, encoded=None, attention_mask=None, encoder_decoder_mask=None,
    deterministic=False, decode=False, max_decode_length=None)``: masks are boolean, True =
    masked out, [b, 1, s, s] and [b, 1, s, s_enc], or te_jax.attention.SequenceDescriptors
    (passed on to the attentions as TE does); DECODER needs ``encoded`` [b, s_enc, hidden] and
    ``encoder_decoder_mask``. The T5 relative position biases index the row's tokens; within a
    (contiguous) packed segment those distances are the segment's own.

    ``decode=True`` is passed to the self attention (MultiHeadAttention's KV cache, in the
    collection ``"cache"`` under ``attention`` / ``self_attention``): the first call creates the
    cache for its inputs' length L, each later call (apply with mutable=["cache"]) takes n >= 1
    tokens per row, [b, n, hidden] (TE's one); DECODER's cross attention runs every step on
    ``encoded`` with ``encoder_decoder_mask`` [b, 1, 1 or n, s_enc]. The T5 bias is then built for
    L x L and the step takes its rows cache_index..cache_index+n-1; ``max_decode_length``, which
    TE uses for that length, may be None or L (else ValueError).
    """

    hidden_size: int = 512
    mlp_hidden_size: int = 2048
    num_attention_heads: int = 8
    num_gqa_groups: int | None = None
    layernorm_type: str = "layernorm"
    layernorm_epsilon: float = 1e-6
    zero_centered_gamma: bool = False
    hidden_dropout: float = 0.1
    hidden_dropout_dims: Sequence[int] = ()
    attention_dropout: float = 0.1
    intermediate_dropout: float = 0.1
    intermediate_dropout_dims: Sequence[int] = ()
    dropout_rng_name: str = "dropout"
    mha_kernel_init: Initializer | None = None
    mlp_kernel_init: Initializer | None = None
    mlp_activations: Sequence[str] = ("relu",)
    mlp_activation_params: dict | None = None
    use_bias: bool = False
    bias_init: Initializer = nn.initializers.zeros
    apply_residual_connection_post_layernorm: bool = False
    output_layernorm: bool = False
    float32_attention_logits: bool = False
    layer_type: TransformerLayerType = TransformerLayerType.ENCODER
    self_attn_mask_type: str = "causal"
    self_attn_bias_type: str | None = None
    enable_relative_embedding: bool = True
    relative_embedding: nn.Module | None = None
    enable_rotary_pos_emb: bool = False
    rotary_pos_emb_windows: tuple[int, int] = (1, 10000)
    rotary_pos_emb_group_method: str = "consecutive"
    low_rank_adaptation_scope: str = "none"
    low_rank_adaptation_dim: int = 32
    low_rank_adaptation_alpha: float | None = None
    dtype: Any = jnp.float32
    drop_path: float = 0.0
    fuse_qkv_params: bool = True
    transpose_batch_sequence: bool = False
    enable_sequence_parallel: bool = False
    scale_attn_logits: bool = False
    scaled_query_init: bool = True
    window_size: tuple[int, int] | None = None
    softmax_type: str = "vanilla"
    qkv_format: str = "bshd"

    @nn.compact
    def __call__(
        self,
        inputs,
        encoded=None,
        attention_mask=None,
        encoder_decoder_mask=None,
        deterministic: bool = False,
        decode: bool = False,
        max_decode_length=None,
    ):
        if self.mlp_activation_params is not None:
            raise NotImplementedError(
                "TransformerLayer: mlp_activation_params is not supported by te_jax yet (its LayerNormMLP "
                "has no parameterized activations such as ('clamped_silu', 'clamped_linear'))"
            )
        check_lora_scope(self, self.low_rank_adaptation_scope)
        if check_qkv_format(self, "self_attn_mask_type") and decode:
            raise ValueError(
                "TransformerLayer.qkv_format: decode=True (the KV cache) takes 'bshd' (TE's decode "
                "runs bshd_bshd_bshd only), got 'thd'"
            )
        if not isinstance(self.layer_type, TransformerLayerType):
            raise ValueError(
                f"TransformerLayer.layer_type: expected TransformerLayerType.ENCODER or .DECODER, "
                f"got {self.layer_type!r}"
            )
        decoder = self.layer_type == TransformerLayerType.DECODER
        (hidden,) = _common.check_size(self, "hidden_size", self.hidden_size, allow_tuple=False)
        _common.check_size(self, "mlp_hidden_size", self.mlp_hidden_size, allow_tuple=False)
        heads = self.num_attention_heads
        if not (
            isinstance(heads, int) and not isinstance(heads, bool) and heads >= 1 and hidden % heads == 0
        ):
            raise ValueError(
                f"TransformerLayer.num_attention_heads: expected an int >= 1 dividing "
                f"hidden_size={hidden}, got {heads!r}"
            )
        head_dim = hidden // heads
        _check_heads(self, head_dim, heads, self.num_gqa_groups)
        hidden_rate = _check_rate(self, "hidden_dropout", self.hidden_dropout)
        drop_path = _check_rate(self, "drop_path", self.drop_path)
        mlp_rate = _check_rate(self, "intermediate_dropout", self.intermediate_dropout)
        x = _common_input(inputs, hidden)
        in_dtype = x.dtype
        hidden_dims = _check_dims(self, "hidden_dropout_dims", self.hidden_dropout_dims, 3)
        mlp_dims = _check_dims(self, "intermediate_dropout_dims", self.intermediate_dropout_dims, 3)
        batch_dim = 1 if self.transpose_batch_sequence else 0
        seq = x.shape[1 - batch_dim]
        if decoder:
            if encoded is None:
                raise ValueError(
                    "encoded: layer_type=TransformerLayerType.DECODER needs the encoder's output "
                    "[b, s_enc, hidden], got None"
                )
            if encoder_decoder_mask is None:
                raise ValueError(
                    "encoder_decoder_mask: the DECODER's cross attention is 'padding' masked; expected "
                    "a boolean [b, 1, s, s_enc] (True = masked out; all False when nothing is padded), "
                    "got None"
                )
            encoded = _common_input(encoded, hidden, "encoded")

        attn_name = "self_attention" if decoder else "attention"
        attn_bias = None
        if self.enable_relative_embedding:
            n = self._relpos_length(seq, decode, max_decode_length, attn_name)
            rel = self.relative_embedding or RelativePositionBiases(
                num_buckets=32,
                max_distance=128,
                num_attention_heads=heads,
                dtype=self.dtype,
                embedding_init=nn.initializers.variance_scaling(1.0, "fan_avg", "uniform"),
                embedding_axes=(),  # replicated, as the attention's projections (see the docs)
                name="relpos_bias",
            )
            attn_bias = rel(n, n, not decoder)

        def mha(**kw):
            return MultiHeadAttention(
                head_dim=head_dim,
                num_attention_heads=heads,
                num_gqa_groups=self.num_gqa_groups,
                attention_dropout=self.attention_dropout,
                dropout_rng_name=self.dropout_rng_name,
                layernorm_type=self.layernorm_type,
                layernorm_epsilon=self.layernorm_epsilon,
                zero_centered_gamma=self.zero_centered_gamma,
                return_layernorm_output=self.apply_residual_connection_post_layernorm,
                kernel_init=self.mha_kernel_init,
                use_bias=self.use_bias,
                bias_init=self.bias_init,
                enable_rotary_pos_emb=self.enable_rotary_pos_emb,
                rotary_pos_emb_windows=self.rotary_pos_emb_windows,
                rotary_pos_emb_group_method=self.rotary_pos_emb_group_method,
                dtype=self.dtype,
                fuse_qkv_params=self.fuse_qkv_params,
                transpose_batch_sequence=self.transpose_batch_sequence,
                enable_sequence_parallel=self.enable_sequence_parallel,
                scale_attn_logits=self.scale_attn_logits,
                scaled_query_init=self.scaled_query_init,
                float32_logits=self.float32_attention_logits,
                window_size=self.window_size,
                softmax_type=self.softmax_type,
                qkv_format=self.qkv_format,
                **kw,
            )

        def dropout(y, rate, dims):
            return nn.Dropout(rate=rate, broadcast_dims=dims, rng_collection=self.dropout_rng_name)(
                y, deterministic=deterministic
            )

        def stochastic_depth(y):
            if drop_path == 0.0:
                return y
            others = tuple(d for d in range(y.ndim) if d != batch_dim)
            return dropout(y, drop_path, others)

        y, ln_out = mha(
            input_layernorm=not self.output_layernorm,
            attn_mask_type=self.self_attn_mask_type,
            attn_bias_type=self.self_attn_bias_type,
            name=attn_name,
        )(x, x, attention_mask, attn_bias, decode=decode, deterministic=deterministic)
        y = stochastic_depth(dropout(y, hidden_rate, hidden_dims))
        x = y + (ln_out if self.apply_residual_connection_post_layernorm else x)

        if decoder:
            y, ln_out = mha(
                input_layernorm=True,
                attn_mask_type="padding",
                attn_bias_type="no_bias",
                name="encoder_decoder_attention",
            )(x, encoded, encoder_decoder_mask, deterministic=deterministic)
            y = dropout(y, hidden_rate, hidden_dims)
            x = y + (ln_out if self.apply_residual_connection_post_layernorm else x)

        y, ln_out = LayerNormMLP(
            intermediate_dim=self.mlp_hidden_size,
            layernorm_type=self.layernorm_type,
            epsilon=self.layernorm_epsilon,
            zero_centered_gamma=self.zero_centered_gamma,
            return_layernorm_output=self.apply_residual_connection_post_layernorm,
            activations=tuple(self.mlp_activations),
            intermediate_dropout_rng_name=self.dropout_rng_name,
            intermediate_dropout_rate=mlp_rate,
            intermediate_hidden_dropout_dims=mlp_dims,
            kernel_init=self.mlp_kernel_init,
            use_bias=self.use_bias,
            bias_init=self.bias_init,
            dtype=self.dtype,
            transpose_batch_sequence=self.transpose_batch_sequence,
            name="mlp",
        )(x, deterministic=deterministic)
        y = stochastic_depth(dropout(y, hidden_rate, hidden_dims))
        out = y + (ln_out if self.apply_residual_connection_post_layernorm else x)

        if self.output_layernorm:
            out = LayerNorm(
                epsilon=self.layernorm_epsilon,
                layernorm_type=self.layernorm_type,
                zero_centered_gamma=self.zero_centered_gamma,
                dtype=self.dtype,
                transpose_batch_sequence=self.transpose_batch_sequence,
                name="output_layernorm",
            )(out)
        return out.astype(in_dtype)

    def _relpos_length(self, seq: int, decode: bool, max_decode_length, attn_name: str) -> int:
        """The query and key length of the T5 bias: the inputs', or in a decode step the KV
        cache's (the self attention takes the bias's row cache_index), which TE reads from
        max_decode_length (DECODER layers; without it TE's steps get a 1 x 1 bias)."""
        if not decode:
            return seq
        cached = self.variables.get(CACHE_COLLECTION, {}).get(attn_name, {}).get("cached_key")
        n = seq if cached is None else cache_length(cached, bool(self.transpose_batch_sequence))
        if max_decode_length is not None and max_decode_length != n:
            what = "the cache's length" if cached is not None else "the inputs' length, which sizes the cache"
            raise ValueError(f"max_decode_length: expected None or {n} ({what}), got {max_decode_length!r}")
        return n


def _common_input(x, hidden: int, name: str = "inputs"):
    x = jnp.asarray(x)
    if x.ndim != 3 or x.shape[-1] != hidden:
        raise ValueError(
            f"{name}: expected [batch, seq, hidden_size] = [*, *, {hidden}] (3 dims), "
            f"got shape {tuple(x.shape)}"
        )
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{name}: expected a floating dtype, got {x.dtype}")
    return x
