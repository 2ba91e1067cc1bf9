"""QuantizedTensor: the torch.Tensor subclass base of te's quantized tensors.

A quantized tensor is a wrapper subclass (``torch.Tensor._make_wrapper_subclass``): to torch it
has the logical shape and the high-precision dtype of the tensor it was quantized from, while
the bytes live in plain inner tensors (FP8 data, fp32 scale_inv) that subclasses name.

``__torch_dispatch__``: ops a subclass implements natively (detach, clone, copy_, ...) run on the
quantized data; every other op dequantizes its quantized arguments, runs in high precision, and
returns plain tensors. An in-place op on a quantized tensor (``qt.add_(1)``, ``qt.copy_(x)``)
runs in high precision and quantizes the result back into ``qt``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)  # tensors that are no subclass
aten = torch.ops.aten


def is_eager(t: torch.Tensor) -> bool:
    """Whether ``t`` is a real tensor outside tracing, so te_core._C can be called directly.

    Under torch.compile / export (and for fake or functional tensors) the registered
    ``torch.ops.te.*`` ops must be used instead."""
    return type(t) in PLAIN_TYPES and not torch.compiler.is_compiling()


class QuantizedTensor(torch.Tensor):
    """Base of te's quantized tensors; see the module docstring. Not constructed directly."""

    # ops a subclass implements natively: {aten overload: handler(func, args, kwargs)}
    _HANDLERS: dict[Any, Callable] = {}
    # when a split parameter's pieces keep the format (the INFO of one that does not says it);
    # every subclass states its rule
    _SPLIT_KEEPS_FP8: str

    __torch_function__ = torch._C._disabled_torch_function_impl

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:  # type: ignore[override]
        """The high-precision tensor (``dtype``, default ``self.dtype``), of shape ``self.shape``."""
        raise NotImplementedError

    def quantize_(self, src: torch.Tensor) -> QuantizedTensor:
        """Quantizes ``src`` (broadcast to ``self.shape``) into this tensor's buffers, in place."""
        raise NotImplementedError

    def update_usage(self, rowwise_usage: bool | None = None, columnwise_usage: bool | None = None) -> None:
        raise NotImplementedError

    def __coerce_same_metadata_as_tangent__(self, expected_metadata, expected_type=None):
        """torch.compile: a quantized gradient (a te layer's ``fp8_grad``) arriving at a compiled
        backward traced with a plain gradient is handed over dequantized (the compiled graph reads
        high precision and quantizes it itself); other mismatches stay AOT autograd's error."""
        if expected_type is torch.Tensor:
            return self.dequantize()
        return None

    def _stable_hash_for_caching(self) -> str:
        """Key for torch.compile's AOT autograd cache: class, shapes, dtypes, flatten context."""
        names, ctx = self.__tensor_flatten__()
        inner = [(n, tuple(getattr(self, n).shape), str(getattr(self, n).dtype)) for n in names]
        key = repr((type(self).__qualname__, tuple(self.shape), self.requires_grad, ctx, inner))
        return hashlib.blake2b(key.encode(), digest_size=16).hexdigest()

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = cls._HANDLERS.get(func)
        if handler is not None:
            result = handler(func, args, kwargs)
            if result is not NotImplemented:
                return result
        return dequantize_fallback(func, args, kwargs)


def _mutated_values(func, args, kwargs) -> list:
    """The argument values ``func``'s schema says it writes (tensors or tensor lists)."""
    mutated = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = args[i] if i < len(args) and not arg.kwarg_only else kwargs.get(arg.name)
        if isinstance(value, (list, tuple)):
            mutated.extend(value)
        elif value is not None:
            mutated.append(value)
    return mutated


_SPLITS = (aten.split.Tensor, aten.split_with_sizes.default)


def dequantize_fallback(func, args, kwargs):
    """Runs ``func`` on dequantized copies of the quantized arguments; see the module docstring."""
    if func in _SPLITS and getattr(args[0], "_is_param", False):
        from te_torch._info_once import info_once

        name = type(args[0]).__name__
        info_once(
            f"split:{name}",
            f"a {name} parameter was split (as FSDP2's fully_shard shards one): its pieces "
            f"are high precision, so its shards are too; {type(args[0])._SPLIT_KEEPS_FP8}",
        )
    written = {id(v) for v in _mutated_values(func, args, kwargs) if isinstance(v, QuantizedTensor)}
    back: list[tuple[QuantizedTensor, torch.Tensor]] = []

    def unwrap(a):
        if not isinstance(a, QuantizedTensor):
            return a
        hp = a.dequantize()
        if id(a) in written:
            back.append((a, hp))
        return hp

    args2, kwargs2 = pytree.tree_map(unwrap, (args, kwargs))
    out = func(*args2, **kwargs2)
    if not back:
        return out
    for qt, hp in back:
        qt.quantize_(hp)
    # an in-place op returns its (now re-quantized) destination, not the high-precision temporary
    swap = {id(hp): qt for qt, hp in back}
    return pytree.tree_map(lambda o: swap.get(id(o), o) if isinstance(o, torch.Tensor) else o, out)


def shallow_or_clone(func, t: torch.Tensor | None) -> torch.Tensor | None:
    """Applies a unary aten op (detach / clone) to an optional inner tensor."""
    return None if t is None else func(t)


# -- aten ops every quantized tensor runs on its inner tensors -------------------------------------
# A subclass provides _tensors() (its inner tensors, None where absent, in the order _like takes
# them), _like(*tensors) (the same format over other inner tensors) and _same_format(other).


def _detach(func, args, kwargs):
    t = args[0]
    return t._like(*t._tensors())


def _clone(func, args, kwargs):
    t = args[0]
    return t._like(*(shallow_or_clone(torch.clone, p) for p in t._tensors()))


def _copy_(func, args, kwargs):
    dst, src = args[0], args[1]
    if not isinstance(dst, QuantizedTensor):
        return NotImplemented  # plain destination: the fallback dequantizes src
    if (
        dst._same_format(src)
        and src.shape == dst.shape
        and all(d is None or s is not None for d, s in zip(dst._tensors(), src._tensors(), strict=True))
    ):  # same format: copy the bytes
        for d, s in zip(dst._tensors(), src._tensors(), strict=True):
            if d is not None:
                d.copy_(s)
        return dst
    if isinstance(src, QuantizedTensor):
        src = src.dequantize()
    if src.device != dst.device:  # copy_ crosses devices (DCP loads through host memory)
        src = src.to(dst.device)
    dst.quantize_(src)
    return dst


# -- row ops FSDP2 shards a parameter with (split, new_zeros, narrow -> slice, view, as_strided) --


def row_handlers(view, split, slice_, as_strided, new_zeros) -> dict:
    """A subclass's _HANDLERS: INNER_HANDLERS and its row ops."""
    return {
        **INNER_HANDLERS,
        aten.view.default: view,
        aten._unsafe_view.default: view,
        aten.split.Tensor: split,
        aten.split_with_sizes.default: split,
        aten.slice.Tensor: slice_,
        aten.as_strided.default: as_strided,
        aten.new_zeros.default: new_zeros,
    }


def slice_args(args, kwargs) -> tuple:
    """(dim, start, end, step) of an aten.slice.Tensor call."""
    dim, start, end, step = (*args[1:], *(0, None, None, 1)[len(args) - 1 :])[:4]
    return dim, start, end, kwargs.get("step", step)


def even_piece(t: torch.Tensor, size: tuple, block: int) -> bool:
    """Whether ``size`` is the shape of each of equal row pieces of the 2-D ``t`` made of whole
    ``block``-row blocks: the pieces a block-scaled tensor keeps its format in."""
    rows = size[0] if len(size) == 2 else 0
    return (
        len(size) == 2 and size[1] == t.shape[1] and rows > 0 and rows % block == 0 and t.shape[0] % rows == 0
    )


def even_split(t: torch.Tensor, how, block: int) -> int | None:
    """The rows of each piece ``torch.split(t, how)`` cuts the 2-D ``t`` into when they are
    equal pieces of whole ``block``-row blocks (even_piece), else None."""
    m = t.shape[0]
    sizes = [how] * (-(-m // how)) if isinstance(how, int) else list(how)
    keep = len(set(sizes)) == 1 and even_piece(t, (sizes[0], t.shape[1]), block)
    return sizes[0] if keep else None


def block_view(func, args, kwargs):
    """aten.view of a block-scaled tensor: keeping the last dim keeps every part's layout (M =
    numel / K rows either way); another last dim is a flat view over the unchanged parts, whose
    geometry stays the row-wise copy's shape. Stored data may pack several elements a byte
    (``_elements_per_byte``, NVFP4's 2) along that last dim."""
    t, size = args[0], args[1]
    rd = t._rowwise_data
    if rd is None:
        return NotImplemented
    shape = func(torch.empty(t.shape, device="meta"), size).shape  # torch's own size checks
    if shape and shape[-1] == rd.shape[-1] * getattr(t, "_elements_per_byte", 1):
        rd = rd.view(*shape[:-1], rd.shape[-1])
    return t._like(rd, t._rowwise_scale_inv, t._columnwise_data, t._columnwise_scale_inv, shape=shape)


INNER_HANDLERS = {aten.detach.default: _detach, aten.clone.default: _clone, aten.copy_.default: _copy_}
