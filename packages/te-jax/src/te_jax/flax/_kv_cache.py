"""MultiHeadAttention's KV cache for autoregressive decoding (``decode=True``), TE Flax's: three
variables in the flax collection ``"cache"``, in the attention module's scope:

    cached_key     [b, L, g, d] ([L, b, g, d] with transpose_batch_sequence), the keys' dtype
    cached_value   the same for the values
    cache_index    int32 scalar, how many tokens of each row are cached

The first ``decode=True`` call (no cache yet: ``model.init``, or ``apply(..., mutable=["cache"])``
on variables without one) creates them, zero, sized by its input (L = its sequence length), and
returns the ordinary forward. Every later call is a step of n >= 1 tokens per row ([b, n, hidden],
[n, b, hidden] with transpose_batch_sequence; n may change from step to step: a prompt's chunks,
then one token at a time, or a speculative draft to verify; TE's steps take one token): their
keys and values (rotated at positions cache_index..cache_index+n-1 with rotary embeddings) are
written there, cache_index advances by n, and the step's query i (at position p = cache_index+i)
attends to cached tokens 0..p under the causal mask types (bottom-right aligned), and to
0..cache_index+n-1 (the step's end) under 'no_mask' and 'padding': either way what the full
forward of that mask type over the tokens cached by the step's end gives at the step's positions
(with n = 1 the two rules agree). The window is taken around each query's position p; the padding
types' mask, [b, 1, 1 or n or L, L], gives the step's rows (rows cache_index..cache_index+n-1 of
one over every query), a bias likewise. A step past the cache's end raises (cache_index concrete)
or, traced under jit, outputs NaN.

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
    step's first token position (cache_index), else 0; ``n`` the step's tokens per row."""

    def __init__(self, module, xq, xkv, transpose_batch_sequence: bool):
        self.module = module
        self.tbs = bool(transpose_batch_sequence)
        self.filled = module.has_variable(CACHE_COLLECTION, "cached_key")
        self.position = 0
        self.n = int(xq.shape[0 if self.tbs else 1])
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
        dims = "[n, b, hidden]" if self.tbs else "[b, n, hidden]"
        for name, x in (("inputs_q", xq), ("inputs_kv", xkv)):
            seq, b = (x.shape[0], x.shape[1]) if self.tbs else (x.shape[1], x.shape[0])
            n_ok = seq >= 1 if name == "inputs_q" else seq == self.n
            if b != batch or not n_ok:
                n_want = "n" if name == "inputs_q" else str(self.n)
                want = f"[{n_want}, {batch}, *]" if self.tbs else f"[{batch}, {n_want}, *]"
                whence = "b from the cache" + (", n from inputs_q" if name == "inputs_kv" else "")
                raise ValueError(
                    f"{name}: decode=True with a filled cache takes a step of n >= 1 tokens per row: "
                    f"expected {dims} = {want} ({whence}), got shape {tuple(x.shape)}"
                )
        self.position = module.get_variable(CACHE_COLLECTION, "cache_index")
        try:
            written = int(self.position)
        except (jax.errors.ConcretizationTypeError, jax.errors.TracerIntegerConversionError):
            written = None  # traced (under jit): a step past the end gives NaNs instead (see guard)
        if self.n > self.length or (written is not None and written + self.n > self.length):
            at, end = ("", f"n = {self.n}") if written is None else (
                f" and cache_index={written}", f"cache_index + n = {written + self.n}"
            )  # fmt: skip
            raise ValueError(
                f"{owner}: the '{CACHE_COLLECTION}' holds {self.length} tokens per row{at}: a step of "
                f"n={self.n} tokens would write past its end ({end} > {self.length}); initialise a longer "
                "cache (a first decode=True call on inputs of the total length)"
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
        index.value = self.position + self.n
        return cached_key.value, cached_value.value

    def step_mask(self, mask, mask_type: str, window, b: int, h: int):
        """The step's boolean mask [b, 1, n, L] (True = masked out): for query i (position
        p = cache_index + i), the tokens after p (causal types) or after the step's last
        (cache_index + n - 1; 'no_mask', 'padding'), those outside the window around p, and,
        with the padding mask types, the user's mask (its rows cache_index..cache_index+n-1 when
        it covers every query)."""
        L, n = self.length, self.n
        j = jnp.arange(L, dtype=jnp.int32)
        p = (self.position + jnp.arange(n, dtype=jnp.int32))[:, None]  # [n, 1]
        causal = mask_type not in ("no_mask", "padding")
        # causal: the keys after p; else those after the step's last token (n = 1: the same)
        masked = j > p if causal else jnp.broadcast_to(j > self.position + (n - 1), (n, L))
        if window is not None and window[0] >= 0:
            masked = masked | (j < p - window[0])
        if window is not None and window[1] >= 0 and not causal:
            masked = masked | (j > p + window[1])
        masked = jnp.broadcast_to(masked, (b, 1, n, L))
        if mask is None or mask_type in _MASK_IGNORED:
            return masked
        if isinstance(mask, SequenceDescriptor):
            raise ValueError(
                f"mask: a decode step takes a boolean mask [b, 1, 1 or n or L, L] (n={n} the step's "
                f"tokens, L={L} the cache's length; True = masked out) or None, got a SequenceDescriptor"
            )
        user = _array(mask, "mask")
        if not (user.dtype == jnp.bool_ or jnp.issubdtype(user.dtype, jnp.integer)):
            raise TypeError(f"mask: expected a boolean (or integer) array, got dtype {user.dtype}")
        self._check_rows(user, (b, h, L, L), "mask", "[b, 1, 1 or n or L, L]", shown=(b, 1, L, L))
        return masked | self._rows(user).astype(jnp.bool_)

    def step_bias(self, bias, b: int, h: int):
        """The step's bias [.., .., n, L]: rows cache_index..cache_index+n-1 of a bias over
        every query (TE's T5 relative position bias [1, h, L, L]), or the step's rows (n, or
        one for all) as given."""
        if bias is None:
            return None
        bias = _array(bias, "bias")
        L = self.length
        self._check_rows(bias, (b, h, L, L), "bias", "[b, h, 1 or n or L, L]")
        return self._rows(bias)

    def _check_rows(self, x, want, name: str, dims: str, shown=None):
        """x broadcastable to ``want`` [b, h, L, L] (any dim may be 1), its query dim 1, n or L."""
        what = f"in a decode step {dims} (n the step's tokens, L the cache's length; here n={self.n}) ="
        _check_shape(x, want[:2] + (None,) + want[3:], name, what, True, shown=shown or want)
        if x.shape[2] not in (1, self.n, self.length):
            _check_shape(x, want, name, what, True, shown=shown)  # raises

    def _rows(self, x):
        """The step's query rows of x [.., .., 1 or n or L, L]: a slice when x covers every query."""
        if x.shape[2] == self.length and x.shape[2] > 1:
            return lax.dynamic_slice_in_dim(x, self.position, self.n, axis=2)
        return x

    def guard(self, out):
        """NaN where a traced step ran past the cache's end (its write was clamped to the last
        n slots)."""
        if not self.filled:
            return out
        fits = self.position + self.n <= self.length
        return jnp.where(fits, out, jnp.asarray(jnp.nan, out.dtype))
