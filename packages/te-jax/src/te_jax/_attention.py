"""TE JAX's attention vocabulary, without flax: the option enums, ``SequenceDescriptor`` (which
tokens of a batch row are real, and which packed sequence each belongs to) and the boolean mask
te_jax.flax.DotProductAttention builds from a descriptor or a mask array.

Shapes: b batch rows, s_q / s_kv query / key tokens per row, n segment slots per row.

A THD layout packs several sequences ("segments") in a row: a token attends only to the tokens of
its own segment in its own row, causal masks and windows compare positions within the segment,
and padding tokens (segment id 0) attend to nothing, so their output is zero. A BSHD layout holds
one sequence per row: a descriptor only says which tokens are padding.
"""

from __future__ import annotations

import enum

import jax
import jax.numpy as jnp
import numpy as np

_I32 = jnp.int32


class AttnMaskType(str, enum.Enum):
    """TE's attention mask types; modules take the member or its string (any case, and TE's
    aliases: 'causal_padding', 'bottom_right_causal', 'causal_padding_bottom_right', ...)."""

    NO_MASK = "no_mask"
    PADDING_MASK = "padding"
    CAUSAL_MASK = "causal"
    PADDING_CAUSAL_MASK = "padding_causal"
    CAUSAL_BOTTOM_RIGHT_MASK = "causal_bottom_right"
    PADDING_CAUSAL_BOTTOM_RIGHT_MASK = "padding_causal_bottom_right"

    def is_causal(self) -> bool:
        return self not in (AttnMaskType.NO_MASK, AttnMaskType.PADDING_MASK)

    def is_padding(self) -> bool:
        return self.value.startswith("padding")

    def is_bottom_right(self) -> bool:
        return self.value.endswith("bottom_right")


class AttnBiasType(str, enum.Enum):
    """TE's bias types: softmax(scale * qk), softmax(scale * (qk + bias)), softmax(scale * qk + bias)."""

    NO_BIAS = "no_bias"
    PRE_SCALE_BIAS = "pre_scale_bias"
    POST_SCALE_BIAS = "post_scale_bias"


class QKVLayout(str, enum.Enum):
    """TE's q/k/v layouts. The THD ones have the BSHD ones' shapes, with several sequences packed
    per batch row (described by a SequenceDescriptor)."""

    BS3HD = "bs3hd"
    BSHD_BS2HD = "bshd_bs2hd"
    BSHD_BSHD_BSHD = "bshd_bshd_bshd"
    T3HD = "t3hd"
    THD_T2HD = "thd_t2hd"
    THD_THD_THD = "thd_thd_thd"

    def is_qkvpacked(self) -> bool:
        return self in (QKVLayout.BS3HD, QKVLayout.T3HD)

    def is_kvpacked(self) -> bool:
        return self in (QKVLayout.BSHD_BS2HD, QKVLayout.THD_T2HD)

    def is_separate(self) -> bool:
        return self in (QKVLayout.BSHD_BSHD_BSHD, QKVLayout.THD_THD_THD)

    def is_thd(self) -> bool:
        return self.value.startswith("t")


class AttnSoftmaxType(str, enum.Enum):
    """vanilla: exp(s_i) / sum_j exp(s_j); off_by_one: exp(s_i) / (1 + sum_j exp(s_j));
    learnable: exp(s_i) / (exp(a_h) + sum_j exp(s_j)), a_h a learned logit per head."""

    VANILLA_SOFTMAX = "vanilla"
    OFF_BY_ONE_SOFTMAX = "off_by_one"
    LEARNABLE_SOFTMAX = "learnable"


MASKS = {m.value: m.value for m in AttnMaskType} | {
    "causal_padding": "padding_causal",
    "bottom_right_causal": "causal_bottom_right",
    "causal_padding_bottom_right": "padding_causal_bottom_right",
    "bottom_right_causal_padding": "padding_causal_bottom_right",
    "bottom_right_padding_causal": "padding_causal_bottom_right",
}
BIASES = {m.value: m.value for m in AttnBiasType}
LAYOUTS = {m.value: m.value for m in QKVLayout}
SOFTMAXES = {m.value: m.value for m in AttnSoftmaxType} | {"off-by-one": "off_by_one"}


def canonical(value, table: dict, name: str) -> str:
    """A TE enum member or string (any case) as the table's canonical string."""
    raw = value.value if isinstance(value, enum.Enum) else value
    key = raw.lower() if isinstance(raw, str) else None
    if key not in table:
        raise ValueError(f"{name}: expected one of {sorted(table)}, got {value!r}")
    return table[key]


def array(x, name: str):
    if not isinstance(x, (jax.Array, np.ndarray)):
        raise TypeError(f"{name}: expected a jax array, got {type(x).__name__}")
    return jnp.asarray(x)


def check_shape(x, want: tuple, name: str, what: str, allow_one: bool = False, shown=None) -> None:
    """x's shape must be ``want`` (None entries: any size; ``allow_one``: any dim may be 1);
    the error shows ``what`` then ``shown`` (default: ``want``)."""
    ok = x.ndim == len(want) and all(
        w is None or d == w or (allow_one and d == 1) for d, w in zip(x.shape, want, strict=True)
    )
    if not ok:
        shown = tuple("*" if w is None else w for w in (want if shown is None else shown))
        raise ValueError(f"{name}: expected {what} {shown}, got shape {tuple(x.shape)}")


# ---- SequenceDescriptor ----

_FIELDS = ("seqlens", "seq_offsets", "segment_ids", "segment_pos")
# the fields each constructor sets, and what the descriptor then describes
_KINDS = {
    ("seqlens",): "seqlens",
    ("seqlens", "seq_offsets"): "offsets",
    ("segment_ids", "segment_pos"): "segment_ids",
}
_SIDES = ("query", "key/value")


def _pair(value, name: str, where: str):
    """None, or a (query, key/value) pair of arrays (one array: the same for both)."""
    if value is None:
        return None
    if isinstance(value, tuple):
        if len(value) != 2:
            raise ValueError(
                f"{where}{name}: expected an array or a (query, key/value) tuple of two arrays, "
                f"got a tuple of {len(value)}"
            )
        return tuple(array(v, f"{where}{name}[{i}] ({_SIDES[i]})") for i, v in enumerate(value))
    return (array(value, f"{where}{name}"),) * 2


def _check_ints(x, name: str, allow_bool: bool = False) -> None:
    ok = jnp.issubdtype(x.dtype, jnp.integer) or (allow_bool and x.dtype == jnp.bool_)
    if not ok:
        kinds = "an integer or boolean" if allow_bool else "an integer"
        raise TypeError(f"{name}: expected {kinds} array, got dtype {x.dtype} (cast with .astype(jnp.int32))")


def _validate(fields: dict, where: str) -> str:
    """The descriptor's kind ('seqlens', 'offsets' or 'segment_ids') after checking its fields'
    presence, dtypes and shapes (the ones that do not depend on the attention's inputs)."""
    given = tuple(k for k in _FIELDS if fields[k] is not None)
    if given not in _KINDS:
        raise ValueError(
            f"{where}expected seqlens (from_seqlens), seqlens and seq_offsets "
            "(from_seqlens_and_offsets) or segment_ids and segment_pos (from_segment_ids_and_pos), "
            f"got {list(given) or 'nothing'}"
        )
    kind = _KINDS[given]
    batch = None
    for i, side in enumerate(_SIDES):

        def at(field, i=i, side=side):
            return f"{where}{field}[{i}] ({side})"

        if kind == "seqlens":
            x = fields["seqlens"][i]
            _check_ints(x, at("seqlens"))
            check_shape(x, (None,), at("seqlens"), "an array of one length per row [b] =")
        elif kind == "offsets":
            x, off = fields["seqlens"][i], fields["seq_offsets"][i]
            _check_ints(x, at("seqlens"))
            _check_ints(off, at("seq_offsets"))
            check_shape(x, (None, None), at("seqlens"), "segment lengths per row [b, n] =")
            want = (x.shape[0], x.shape[1] + 1)
            check_shape(off, want, at("seq_offsets"), "segment starts per row [b, n + 1] =")
        else:
            x, pos = fields["segment_ids"][i], fields["segment_pos"][i]
            _check_ints(x, at("segment_ids"), allow_bool=True)
            _check_ints(pos, at("segment_pos"))
            check_shape(x, (None, None), at("segment_ids"), "a segment id per token [b, s] =")
            check_shape(pos, x.shape, at("segment_pos"), "the shape of its segment_ids")
        if batch is not None and x.shape[0] != batch:
            raise ValueError(
                f"{where}{given[0]}: expected the same batch size for query and key/value, got "
                f"{batch} and {x.shape[0]}"
            )
        batch = x.shape[0]
    return kind


def _positions_in_runs(ids):
    """Each token's index within its run of equal ids along the last dim."""
    idx = jnp.arange(ids.shape[-1], dtype=_I32)
    starts = jnp.concatenate([jnp.ones(ids.shape[:-1] + (1,), bool), ids[..., 1:] != ids[..., :-1]], axis=-1)
    return idx - jax.lax.cummax(jnp.where(starts, idx, 0), axis=ids.ndim - 1)


@jax.tree_util.register_pytree_node_class
class SequenceDescriptor:
    """Which tokens of each batch row are real, and which packed sequence (segment) each belongs
    to: TE JAX's ``transformer_engine.jax.attention.SequenceDescriptor``, passed to
    DotProductAttention as ``sequence_descriptor`` (or MultiHeadAttention's ``mask``).

    Build it with a constructor (each field is a (query, key/value) pair; one array stands for
    both):

    - ``from_seqlens(seqlens)``: BSHD layouts; seqlens [b] ints, the first seqlens[i] tokens of
      row i are real, the rest padding.
    - ``from_seqlens_and_offsets(seqlens, seq_offsets)``: THD layouts; seqlens [b, n] and
      seq_offsets [b, n + 1]: segment k of row i is tokens seq_offsets[i, k] ..
      seq_offsets[i, k] + seqlens[i, k] - 1; slots with a length <= 0 or a negative offset are
      unused (TE pads them with -1); the last offset is not read (TE's cuDNN end marker). The
      query's segment in slot k attends to the key/value segment in slot k, as in TE.
    - ``from_segment_ids_and_pos(segment_ids, segment_pos=None)``: both; segment_ids [b, s]
      (integer or boolean; 0 = padding, tokens of a row with the same nonzero id are one
      segment, and a query attends to the keys with its id), segment_pos [b, s] each token's
      position within its segment (None: the index within its run of equal ids). Under a BSHD
      layout only id != 0 (real token) matters.

    A pytree (its four fields are its leaves), so it passes through jax.jit as an argument.
    Attributes (TE's): ``seqlens``, ``seq_offsets``, ``segment_ids``, ``segment_pos``, each a
    (query, key/value) tuple of arrays, or None where the constructor does not set it.
    """

    def __init__(self, seqlens=None, seq_offsets=None, segment_ids=None, segment_pos=None):
        where = "SequenceDescriptor: "
        fields = {
            name: _pair(value, name, where)
            for name, value in zip(_FIELDS, (seqlens, seq_offsets, segment_ids, segment_pos), strict=True)
        }
        _validate(fields, where)
        for name, value in fields.items():
            setattr(self, name, value)

    @classmethod
    def from_seqlens(cls, seqlens) -> SequenceDescriptor:
        """One sequence per row (BSHD layouts): seqlens [b] (or a (q, kv) pair) real tokens
        first, padding after."""
        return cls(seqlens=seqlens)

    @classmethod
    def from_seqlens_and_offsets(cls, seqlens, seq_offsets) -> SequenceDescriptor:
        """Packed sequences (THD layouts): seqlens [b, n] and seq_offsets [b, n + 1] (or (q, kv)
        pairs), -1 in unused slots."""
        if seq_offsets is None:
            raise ValueError(
                "SequenceDescriptor: seq_offsets: expected the segments' starts [b, n + 1] (or a "
                "(query, key/value) pair), got None; use from_seqlens for one sequence per row"
            )
        return cls(seqlens=seqlens, seq_offsets=seq_offsets)

    @classmethod
    def from_segment_ids_and_pos(cls, segment_ids, segment_pos=None) -> SequenceDescriptor:
        """Segment ids [b, s] (0 = padding) and positions within the segments [b, s] (or (q, kv)
        pairs); segment_pos None: each token's index within its run of equal ids."""
        ids = _pair(segment_ids, "segment_ids", "SequenceDescriptor: ")
        if segment_pos is None and ids is not None:
            segment_pos = tuple(_positions_in_runs(x) for x in ids)
        return cls(segment_ids=ids, segment_pos=segment_pos)

    def tree_flatten(self):
        return tuple(getattr(self, name) for name in _FIELDS), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        del aux
        # jax rebuilds pytrees with placeholders for leaves (tracers, None, sentinels): no checks
        out = object.__new__(cls)
        for name, value in zip(_FIELDS, children, strict=True):
            setattr(out, name, value)
        return out

    def __repr__(self) -> str:
        parts = []
        for name in _FIELDS:
            value = getattr(self, name)
            if value is not None:
                shapes = ", ".join(str(tuple(getattr(v, "shape", ()))) for v in value)
                parts.append(f"{name}=({shapes})")
        return f"SequenceDescriptor({', '.join(parts)})"


# ---- the mask ----


def _kind_at_call(desc: SequenceDescriptor) -> str:
    fields = {}
    for name in _FIELDS:
        value = getattr(desc, name)
        if value is not None and not (isinstance(value, tuple) and len(value) == 2):
            raise ValueError(
                f"sequence_descriptor.{name}: expected None or a (query, key/value) pair of "
                f"arrays, got {type(value).__name__}"
            )
        fields[name] = (
            None
            if value is None
            else tuple(
                array(v, f"sequence_descriptor.{name}[{i}] ({_SIDES[i]})") for i, v in enumerate(value)
            )
        )
    return _validate(fields, "sequence_descriptor.")


def _check_rows(x, b: int, s: int | None, name: str, what: str) -> None:
    want = (b,) if s is None else (b, s)
    dims = "[b]" if s is None else f"[b, {what}]"
    check_shape(x, want, name, f"{dims} of the attention's inputs =")


def _thd_segments(seq, layout: str, b: int, sq: int, skv: int):
    """(ids_q [b, s_q], ids_kv [b, s_kv], pos_q, pos_kv) int32 of a THD descriptor."""
    takes = (
        "a SequenceDescriptor saying which packed sequence each token belongs to "
        "(from_segment_ids_and_pos or from_seqlens_and_offsets)"
    )
    if seq is None or isinstance(seq, (jax.Array, np.ndarray)):
        got = "None" if seq is None else "a mask array (TE's THD takes none either)"
        raise ValueError(
            f"sequence_descriptor: qkv_layout={layout!r} (packed sequences) needs {takes}, got {got}"
        )
    kind = _kind_at_call(seq)
    if kind == "seqlens":
        raise ValueError(
            f"sequence_descriptor: SequenceDescriptor.from_seqlens describes one sequence per row "
            f"(BSHD layouts); qkv_layout={layout!r} needs {takes}"
        )
    out = []
    for i, s, what in ((0, sq, "s_q"), (1, skv, "s_kv")):
        if kind == "segment_ids":
            ids, pos = seq.segment_ids[i], seq.segment_pos[i]
            _check_rows(ids, b, s, f"sequence_descriptor.segment_ids[{i}] ({_SIDES[i]})", what)
            out.append((ids.astype(_I32), pos.astype(_I32)))
            continue
        lens, offs = seq.seqlens[i].astype(_I32), seq.seq_offsets[i].astype(_I32)
        check_shape(
            lens,
            (b, None),
            f"sequence_descriptor.seqlens[{i}] ({_SIDES[i]})",
            "[b, n] with b of the inputs =",
        )
        starts = offs[:, : lens.shape[1], None]  # [b, n, 1]
        t = jnp.arange(s, dtype=_I32)
        inside = (t >= starts) & (t < starts + lens[:, :, None]) & (starts >= 0)  # [b, n, s]
        slot = jnp.argmax(inside, axis=1)  # the first segment holding the token
        real = jnp.any(inside, axis=1)
        start = jnp.take_along_axis(starts[:, :, 0], slot, axis=1)
        out.append((jnp.where(real, slot + 1, 0), jnp.where(real, t - start, 0)))
    (ids_q, pos_q), (ids_kv, pos_kv) = out
    return ids_q, ids_kv, pos_q, pos_kv


def _bshd_padding(seq, mask_type: str, b: int, h: int, sq: int, skv: int):
    """(masked, (len_q [b], len_kv [b])) of a BSHD padding mask type: masked is True where a
    query or key is padding, broadcastable to [b, h, s_q, s_kv]; the lengths count real tokens."""
    if seq is None:
        raise ValueError(
            f"mask: attn_mask_type={mask_type!r} needs a mask [b, 1, s_q, s_kv] = [{b}, 1, {sq}, {skv}] "
            "(True = masked out) or a SequenceDescriptor; pass an all-False one when nothing is padded, "
            "or use attn_mask_type='no_mask' / 'causal'"
        )
    if isinstance(seq, SequenceDescriptor):
        if seq.seqlens is not None:
            for i in range(2):
                _check_rows(seq.seqlens[i], b, None, f"sequence_descriptor.seqlens[{i}] ({_SIDES[i]})", "")
            len_q, len_kv = (x.astype(_I32) for x in seq.seqlens)
            real_q = jnp.arange(sq) < len_q[:, None]
            real_kv = jnp.arange(skv) < len_kv[:, None]
        else:
            for i, s, what in ((0, sq, "s_q"), (1, skv, "s_kv")):
                _check_rows(
                    seq.segment_ids[i], b, s, f"sequence_descriptor.segment_ids[{i}] ({_SIDES[i]})", what
                )
            real_q, real_kv = (x != 0 for x in seq.segment_ids)
            len_q, len_kv = (jnp.sum(x, axis=1, dtype=_I32) for x in (real_q, real_kv))
        return ~real_q[:, None, :, None] | ~real_kv[:, None, None, :], (len_q, len_kv)
    mask = jnp.asarray(seq)
    if not (mask.dtype == jnp.bool_ or jnp.issubdtype(mask.dtype, jnp.integer)):
        raise TypeError(f"mask: expected a boolean (or integer) array, got dtype {mask.dtype}")
    check_shape(
        mask, (b, h, sq, skv), "mask", "a shape broadcastable to [b, 1, s_q, s_kv] =", True,
        shown=(b, 1, sq, skv),
    )  # fmt: skip
    masked = mask.astype(jnp.bool_)
    # a real query sees some key, a real key is seen by some query (the lengths align bottom-right)
    open_ = ~jnp.broadcast_to(masked, (b, masked.shape[1], sq, skv))
    lens = tuple(jnp.sum(jnp.any(open_, axis=axes), axis=1, dtype=_I32) for axes in ((1, 3), (1, 2)))
    return masked, lens


def _same_id_counts(ids):
    """[b, s]: how many tokens of the row share each token's id (its segment's length)."""
    return jnp.sum(ids[:, :, None] == ids[:, None, :], axis=-1, dtype=_I32)


def build_mask(seq, *, layout: str, mask_type: str, window, b: int, h: int, sq: int, skv: int):
    """The boolean mask (True = masked out) broadcastable to [b, h, s_q, s_kv], or None.

    ``seq``: a SequenceDescriptor, a mask array or None (the caller checked which);
    ``layout``, ``mask_type``: canonical strings; ``window``: None or (left, right), a negative
    side unbounded. With ``shift`` the bottom-right offset (s_kv - s_q, per row or per
    segment), a key at position j is visible from the query at position i when j <= i + shift
    (causal) and i + shift - left <= j <= i + shift + right (window)."""
    padding = mask_type.startswith("padding")
    causal = mask_type not in ("no_mask", "padding")
    bottom_right = mask_type.endswith("bottom_right")
    shift = 0
    if QKVLayout(layout).is_thd():
        ids_q, ids_kv, pos_q, pos_kv = _thd_segments(seq, layout, b, sq, skv)
        masked = (ids_q[:, None, :, None] != ids_kv[:, None, None, :]) | (ids_q == 0)[:, None, :, None]
        qpos, kpos = pos_q[:, None, :, None], pos_kv[:, None, None, :]
        if bottom_right:
            shift = _same_id_counts(ids_kv)[:, None, None, :] - _same_id_counts(ids_q)[:, None, :, None]
    else:
        if isinstance(seq, SequenceDescriptor) and _kind_at_call(seq) == "offsets":
            raise ValueError(
                "sequence_descriptor: SequenceDescriptor.from_seqlens_and_offsets describes packed "
                f"sequences (THD layouts: 't3hd', 'thd_t2hd', 'thd_thd_thd'); qkv_layout={layout!r} "
                "takes from_seqlens, from_segment_ids_and_pos or a mask"
            )
        masked = None
        qpos, kpos = jnp.arange(sq)[:, None], jnp.arange(skv)[None, :]
        if padding:
            masked, (len_q, len_kv) = _bshd_padding(seq, mask_type, b, h, sq, skv)
            if bottom_right:
                shift = (len_kv - len_q)[:, None, None, None]
        elif bottom_right:
            shift = skv - sq
    past = kpos - qpos - shift  # how far the key lies right of the query's diagonal
    extra = past > 0 if causal else None
    if window is not None:
        left, right = window
        for unbounded, outside in ((left < 0, past < -left), (right < 0, past > right)):
            if not unbounded:
                extra = outside if extra is None else extra | outside
    if extra is not None:
        extra = extra[None, None] if extra.ndim == 2 else extra
        masked = extra if masked is None else masked | extra
    return masked
