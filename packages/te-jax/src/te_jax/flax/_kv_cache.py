"""MultiHeadAttention's KV cache for autoregressive decoding (``decode=True``), TE Flax's: three
variables in the flax collection ``"cache"``, in the attention module's scope:

    cached_key     [b, L, g, d] ([L, b, g, d] with transpose_batch_sequence), the keys' dtype
    cached_value   the same for the values
    cache_index    int32 scalar, how many tokens of each row are cached

The first ``decode=True`` call (no cache yet: ``model.init``, or ``apply(..., mutable=["cache"])``
on variables without one) creates them, zero, sized by its input (L = its sequence length), and
returns the ordinary forward. Every later call is a step: one token per row, whose key and value
(rotated at position cache_index with rotary embeddings) are written at cache_index, which then
advances; its query attends to cached tokens 0..cache_index.

Where TE differs, te follows what makes a step equal the full causal forward at that position:
TE rotates every step's q and k at position 0, masks the step only through mask types that keep a
mask (its 'causal' ignores masks), checks a GQA step's query against the cache's key heads, and
asserts against the fused qkv / kv projections (unless rotary embeddings are on); te does none of
these. The cache's structure, names, shapes and dtypes are TE's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from te_jax._attention import SequenceDescriptor
from te_jax._attention import array as _array
from te_jax._attention import check_shape as _check_shape

CACHE_COLLECTION = "cache"
# the mask types that ignore a user's mask (DotProductAttention's rule, TE's)
_MASK_IGNORED = ("no_mask", "causal", "causal_bottom_right")


def cache_length(cached_key, transpose_batch_sequence: bool) -> int:
    return int(cached_key.shape[0 if transpose_batch_sequence else 1])


class KVCache:
    """The cache of one MultiHeadAttention call with decode=True. ``filled``: the cache exists,
    so this call is a step (its inputs checked against the cache); ``position`` is then the
    step's token position (cache_index), else 0."""

    def __init__(self, module, xq, xkv, transpose_batch_sequence: bool):
        self.module = module
        self.tbs = bool(transpose_batch_sequence)
        self.filled = module.has_variable(CACHE_COLLECTION, "cached_key")
        self.position = 0
        if not self.filled:
            return
        owner = type(module).__name__
        if not module.is_mutable_collection(CACHE_COLLECTION):
            raise ValueError(
                f"{owner}: decode=True writes the step's key and value into the '{CACHE_COLLECTION}' "
                f"collection; call apply(..., mutable=['{CACHE_COLLECTION}'])"
            )
        cached = module.get_variable(CACHE_COLLECTION, "cached_key")
        self.length = cache_length(cached, self.tbs)
        batch = cached.shape[1 if self.tbs else 0]
        want, dims = ((1, batch), "[1, b, hidden]") if self.tbs else ((batch, 1), "[b, 1, hidden]")
        for name, x in (("inputs_q", xq), ("inputs_kv", xkv)):
            if tuple(x.shape[:2]) != want:
                raise ValueError(
                    f"{name}: decode=True with a filled cache takes one token per row and call (as TE): "
                    f"expected {dims} = [{want[0]}, {want[1]}, *] (b from the cache), got shape "
                    f"{tuple(x.shape)}"
                )
        self.position = module.get_variable(CACHE_COLLECTION, "cache_index")
        try:
            written = int(self.position)
        except (jax.errors.ConcretizationTypeError, jax.errors.TracerIntegerConversionError):
            return  # traced (under jit): a step past the end gives NaNs instead (see guard)
        if written >= self.length:
            raise ValueError(
                f"{owner}: the '{CACHE_COLLECTION}' holds {self.length} tokens per row and cache_index="
                f"{written}: it is full; initialise a longer cache (a first decode=True call on "
                "inputs of the total length)"
            )

    def update(self, k, v, kv_name: str):
        """The keys and values the call attends to: the step's written into the cache, or, on the
        call creating the cache, the call's own."""
        m = self.module
        cached_key = m.variable(CACHE_COLLECTION, "cached_key", jnp.zeros, k.shape, k.dtype)
        cached_value = m.variable(CACHE_COLLECTION, "cached_value", jnp.zeros, v.shape, v.dtype)
        index = m.variable(CACHE_COLLECTION, "cache_index", lambda: jnp.array(0, dtype=jnp.int32))
        if not self.filled:
            return k, v
        for new, var in ((k, cached_key), (v, cached_value)):
            if new.dtype != var.value.dtype or new.shape[2:] != var.value.shape[2:]:
                raise ValueError(
                    f"{kv_name}: the cache holds {var.value.dtype} keys/values [.., {var.value.shape[2]}, "
                    f"{var.value.shape[3]}] (from the call that created it); this step's are {new.dtype} "
                    f"[.., {new.shape[2]}, {new.shape[3]}]"
                )
        axis = 0 if self.tbs else 1
        cached_key.value = lax.dynamic_update_slice_in_dim(cached_key.value, k, self.position, axis)
        cached_value.value = lax.dynamic_update_slice_in_dim(cached_value.value, v, self.position, axis)
        index.value = self.position + 1
        return cached_key.value, cached_value.value

    def step_mask(self, mask, mask_type: str, window, b: int, h: int):
        """The step's boolean mask [b, 1, 1, L] (True = masked out): the tokens not written yet,
        those left of the window, and, with the padding mask types, the user's mask (its row
        cache_index when it covers every query)."""
        L = self.length
        j = jnp.arange(L, dtype=jnp.int32)
        masked = j > self.position
        if window is not None and window[0] >= 0:
            masked = masked | (j < self.position - window[0])
        masked = jnp.broadcast_to(masked, (b, 1, 1, L))
        if mask is None or mask_type in _MASK_IGNORED:
            return masked
        if isinstance(mask, SequenceDescriptor):
            raise ValueError(
                f"mask: a decode step takes a boolean mask [b, 1, 1, L] = [{b}, 1, 1, {L}] (True = masked "
                "out) or None, got a SequenceDescriptor"
            )
        user = _array(mask, "mask")
        if not (user.dtype == jnp.bool_ or jnp.issubdtype(user.dtype, jnp.integer)):
            raise TypeError(f"mask: expected a boolean (or integer) array, got dtype {user.dtype}")
        _check_shape(
            user, (b, h, L, L), "mask", "in a decode step [b, 1, 1 or L, L] (L the cache's length) =", True,
            shown=(b, 1, L, L),
        )  # fmt: skip
        return masked | self._row(user).astype(jnp.bool_)

    def step_bias(self, bias, b: int, h: int):
        """The step's bias [.., .., 1, L]: row cache_index of a bias over every query (TE's
        T5 relative position bias [1, h, L, L]), or a one-row bias as given."""
        if bias is None:
            return None
        bias = _array(bias, "bias")
        L = self.length
        what = "in a decode step [b, h, 1 or L, L] (L the cache's length) ="
        _check_shape(bias, (b, h, L, L), "bias", what, True)
        return self._row(bias)

    def _row(self, x):
        return lax.dynamic_slice_in_dim(x, self.position, 1, axis=2) if x.shape[2] > 1 else x

    def guard(self, out):
        """NaN where a traced step ran past the cache's end (its write went to the last slot)."""
        if not self.filled:
            return out
        return jnp.where(self.position < self.length, out, jnp.asarray(jnp.nan, out.dtype))
