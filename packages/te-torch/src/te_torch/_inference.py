"""``te.InferenceParams``: TE's KV cache for generation, non-paged or paged, and its managers.

One step of generation, as in TE::

    params = te.InferenceParams(max_batch_size, max_sequence_length, num_heads_kv, head_dim_k, dtype)
    for step in steps:
        params.pre_step(OrderedDict(zip(seq_ids, step_lens)))  # the batch of this step, in order
        out = model(x, attn_mask_type="padding_causal", inference_params=params)

``pre_step`` names the sequences of this step in batch order with their new token counts: a new
id starts a sequence (its prompt), a known id continues it, a known id left out is finished and
its memory freed. Each attention layer (te.DotProductAttention with a ``layer_number``) then writes
its new keys and values into the cache and attends over each sequence's whole history.

The cache holds keys and values as bshd, [sequence, position, kv head, channel]: non-paged one row
of ``max_sequence_length`` positions per sequence, paged a pool of ``page_size`` pages that each
sequence takes as it grows. Everything a step needs (lengths, copy indices) is worked out on the
host once per step, in ``pre_step`` and each layer format's first ``step``, and sent to the
device in one copy; the layers then run with no host sync.

The cache is for inference: no gradient flows into it.
"""

from __future__ import annotations

import collections
import math
import numbers
from collections import OrderedDict
from collections.abc import Mapping

import torch

from te_torch._availability import default_device
from te_torch._info_once import info_once
from te_torch._module_base import FLOAT_DTYPES

__all__ = ["InferenceParams", "KVCacheManager", "NonPagedKVCacheManager", "PagedKVCacheManager"]

QKV_FORMATS = ("bshd", "sbhd", "thd")


def _device(device) -> torch.device:
    """``device`` with its index (a bare "cuda" is the current device), as tensors report it."""
    device = default_device() if device is None else torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _count(owner: str, arg: str, value, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{owner}: {arg}: expected an int >= {low}, got {value!r}")
    return int(value)


class KVCacheManager:
    """Base class of the KV cache managers (TE's contract, for ``custom_cache_manager``).

    ``cache`` maps a layer number to its (k_cache, v_cache); ``sequences`` maps each sequence id
    of the current step, in batch order, to its length after the step.
    """

    def __init__(self) -> None:
        self.cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.sequences: OrderedDict = OrderedDict()

    def reset(self) -> None:
        """Forgets every sequence (the memory stays allocated)."""
        self.sequences = OrderedDict()

    def allocate_memory(self, layer_number: int) -> None:
        """Allocates layer ``layer_number``'s key and value cache."""
        raise NotImplementedError(f"{type(self).__name__}: allocate_memory is not implemented")

    def pre_step(self, step_dict: OrderedDict) -> OrderedDict:
        """Takes this step's {sequence id: new tokens} and returns ``sequences``."""
        raise NotImplementedError(f"{type(self).__name__}: pre_step is not implemented")

    def step(
        self,
        layer_number: int,
        new_k: torch.Tensor,
        new_v: torch.Tensor,
        cu_new_seqlens: torch.Tensor,
        cu_cached_seqlens: torch.Tensor,
        qkv_format: str,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Writes the new tokens into layer ``layer_number``'s cache and returns the cache: bshd
        [batch, max_sequence_length, kv heads, channels] with each sequence's tokens first, or,
        for a paged manager (one with a ``page_table``), the page pool [pages, page_size, kv
        heads, channels]."""
        raise NotImplementedError(f"{type(self).__name__}: step is not implemented")


class _Manager(KVCacheManager):
    """What te's two managers share: the per-layer buffers, the step's host-side bookkeeping
    (each batch entry's length before and after) and the copy of new tokens by flat indices."""

    def __init__(self, rows: int, row_len: int, num_heads, head_dim_k, dtype, head_dim_v, device) -> None:
        super().__init__()
        self._shape_k = (rows, row_len, num_heads, head_dim_k)
        self._shape_v = (rows, row_len, num_heads, head_dim_v if head_dim_v is not None else head_dim_k)
        self.dtype = dtype
        self.device = _device(device)
        self._pre: list[int] = []
        self._steps: list[int] = []
        self._copy_index: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self._checked: set[tuple] = set()
        self._start: int | None = None

    def allocate_memory(self, layer_number: int) -> None:
        self.cache[layer_number] = (
            torch.zeros(self._shape_k, dtype=self.dtype, device=self.device),
            torch.zeros(self._shape_v, dtype=self.dtype, device=self.device),
        )

    def _advance(self, step_dict: OrderedDict) -> None:
        """The new batch in step_dict's order: known ids grow by their step, the rest start."""
        self._pre = [self.sequences.get(seq, 0) for seq in step_dict]
        self._steps = list(step_dict.values())
        self.sequences = OrderedDict(
            (seq, pre + n) for (seq, n), pre in zip(step_dict.items(), self._pre, strict=True)
        )
        self._copy_index = {}
        self._checked = set()
        # Every sequence at the same length taking the same number of tokens (a static batch's
        # decode step): a non-paged cache takes the new tokens as one slice, without indices.
        same = len(set(self._pre)) == 1 and len(set(self._steps)) == 1
        self._start = self._pre[0] if same else None

    def _dst(self, batch: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Flat positions in the [rows * row_len] cache of (batch entry, position) pairs."""
        raise NotImplementedError

    def _indices(self, qkv_format: str, new_k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(source rows of the flattened new tokens, destination rows of the flattened cache),
        worked out on the host once per step and format and reused by every layer."""
        b = len(self._steps)
        if qkv_format == "bshd":
            lead = (new_k.shape[0], new_k.shape[1])
        elif qkv_format == "sbhd":
            lead = (new_k.shape[1], new_k.shape[0])
        else:
            lead = (new_k.shape[0],)
        key = (qkv_format, lead)
        if key not in self._copy_index:
            steps = torch.tensor(self._steps, dtype=torch.long)
            batch = torch.repeat_interleave(torch.arange(b), steps)
            starts = torch.cumsum(steps, 0) - steps
            j = torch.arange(int(steps.sum())) - starts[batch]  # each new token's index in its step
            if qkv_format == "bshd":
                src = batch * lead[1] + j
            elif qkv_format == "sbhd":
                src = j * lead[0] + batch
            else:
                src = starts[batch] + j
            dst = self._dst(batch, torch.tensor(self._pre, dtype=torch.long)[batch] + j)
            self._copy_index[key] = (src.to(self.device), dst.to(self.device))
        return self._copy_index[key]

    def _check_new(self, qkv_format: str, new_k: torch.Tensor, new_v: torch.Tensor) -> None:
        """new_k / new_v fit this step (checked once a step per layout: every layer passes alike)."""
        key = (qkv_format, new_k.shape, new_v.shape, new_k.device, new_v.device)
        if key in self._checked:
            return
        owner = "InferenceParams.step"
        b, longest, total = len(self._steps), max(self._steps), sum(self._steps)
        for arg, x, shape in (("new_k", new_k, self._shape_k), ("new_v", new_v, self._shape_v)):
            if not isinstance(x, torch.Tensor) or x.dim() != (3 if qkv_format == "thd" else 4):
                raise ValueError(f"{owner}: {arg}: expected a {qkv_format} tensor, got {_describe(x)}")
            if tuple(x.shape[-2:]) != shape[2:]:
                raise ValueError(
                    f"{owner}: {arg}: expected [..., num_heads_kv={shape[2]}, {shape[3]}] per token, "
                    f"got {tuple(x.shape)}"
                )
            if x.device != self.device:
                raise ValueError(
                    f"{owner}: {arg}: expected it on the cache's device {self.device}, got {x.device}"
                )
            if qkv_format == "thd":
                if x.shape[0] < total:
                    raise ValueError(
                        f"{owner}: {arg}: this step has {total} new tokens (pre_step), got a thd tensor of "
                        f"{x.shape[0]}"
                    )
            else:
                bb, s = (x.shape[0], x.shape[1]) if qkv_format == "bshd" else (x.shape[1], x.shape[0])
                if bb != b or s < longest:
                    raise ValueError(
                        f"{owner}: {arg}: pre_step gave {b} sequences of up to {longest} new tokens; "
                        f"expected {qkv_format} with batch {b}, sequence >= {longest}; got {tuple(x.shape)}"
                    )
        # the copy indices are worked out from new_k's layout and read new_v by them too
        if qkv_format != "thd" and new_v.shape[:2] != new_k.shape[:2]:
            raise ValueError(
                f"{owner}: new_v: expected new_k's leading dims {tuple(new_k.shape[:2])}, got "
                f"{tuple(new_v.shape)}"
            )
        self._checked.add(key)

    def _write(self, cache, new, src, dst) -> None:
        flat = new.detach().reshape(-1, *new.shape[-2:]).index_select(0, src)
        cache.view(-1, *cache.shape[-2:]).index_copy_(0, dst, flat.to(cache.dtype))

    def _write_slice(self, cache, new, qkv_format: str) -> None:
        """A uniform step's tokens (``_start``) into rows [0, b) at positions [start, start + s)."""
        b, s, p = len(self._steps), self._steps[0], self._start
        if qkv_format == "bshd":
            new = new[:, :s]
        elif qkv_format == "sbhd":
            new = new[:s].transpose(0, 1)
        else:
            new = new[: b * s].view(b, s, *new.shape[1:])
        cache[:b, p : p + s].copy_(new.detach())


class NonPagedKVCacheManager(_Manager):
    """One cache row of ``max_seqlen`` positions per sequence: k [max_batch_size, max_seqlen,
    num_heads, head_dim_k], v likewise with head_dim_v. Batch entry i of a step lives in row i;
    when the batch changes (a sequence finishes, joins or moves), each layer's rows are moved
    once, at that layer's next step."""

    def __init__(
        self,
        max_batch_size: int,
        max_seqlen: int,
        num_heads: int,
        head_dim_k: int,
        dtype: torch.dtype,
        head_dim_v: int | None = None,
        device=None,
    ) -> None:
        super().__init__(
            max_batch_size, max_seqlen, num_heads, head_dim_k, dtype, head_dim_v, device
        )  # fmt: skip
        self.max_batch_size = max_batch_size
        self.max_seqlen = max_seqlen
        self._rows: OrderedDict = OrderedDict()  # sequence id -> its cache row
        self._move: torch.Tensor | None = None  # rows [0, b) take the rows these indices name
        self._to_move: set[int] = set()

    def reset(self) -> None:
        super().reset()
        self._rows = OrderedDict()
        self._to_move = set()

    def pre_step(self, step_dict: OrderedDict) -> OrderedDict:
        src = [self._rows.get(seq, i) for i, seq in enumerate(step_dict)]
        moved = any(seq in self._rows and self._rows[seq] != i for i, seq in enumerate(step_dict))
        self._advance(step_dict)
        self._rows = OrderedDict((seq, i) for i, seq in enumerate(step_dict))
        if moved:
            self._move = torch.tensor(src, dtype=torch.long).to(self.device)
            self._to_move = set(self.cache)
        return self.sequences

    def _dst(self, batch: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return batch * self.max_seqlen + pos

    def step(self, layer_number, new_k, new_v, cu_new_seqlens, cu_cached_seqlens, qkv_format):
        self._check_new(qkv_format, new_k, new_v)
        k_cache, v_cache = self.cache[layer_number]
        if layer_number in self._to_move:
            self._to_move.discard(layer_number)
            b = self._move.numel()
            k_cache[:b] = k_cache.index_select(0, self._move)
            v_cache[:b] = v_cache.index_select(0, self._move)
        if self._start is not None:
            self._write_slice(k_cache, new_k, qkv_format)
            self._write_slice(v_cache, new_v, qkv_format)
        else:
            src, dst = self._indices(qkv_format, new_k)
            self._write(k_cache, new_k, src, dst)
            self._write(v_cache, new_v, src, dst)
        b = len(self._steps)
        return k_cache[:b], v_cache[:b]


class PagedKVCacheManager(_Manager):
    """A pool of ``total_num_pages`` pages of ``page_size`` positions: k [total_num_pages,
    page_size, num_heads, head_dim_k], v likewise. A sequence takes pages as it grows and frees
    them when it finishes; ``page_table`` [max_batch_size, max_seqlen / page_size] int32 lists
    each batch entry's pages in order (unused entries 0)."""

    def __init__(
        self,
        total_num_pages: int,
        page_size: int,
        num_heads: int,
        head_dim_k: int,
        dtype: torch.dtype,
        max_batch_size: int,
        max_seqlen: int,
        head_dim_v: int | None = None,
        device=None,
    ) -> None:
        super().__init__(
            total_num_pages, page_size, num_heads, head_dim_k, dtype, head_dim_v, device
        )  # fmt: skip
        self.total_num_pages = total_num_pages
        self.page_size = page_size
        self.max_batch_size = max_batch_size
        self.max_seqlen = max_seqlen
        self.max_pages_per_seq = max_seqlen // page_size
        self.page_table = torch.zeros(
            max_batch_size, self.max_pages_per_seq, dtype=torch.int32, device=self.device
        )
        self.reset()

    def reset(self) -> None:
        super().reset()
        self.free_pages = collections.deque(range(self.total_num_pages))
        self.allocated_pages: dict = {}
        self._table = torch.zeros(self.max_batch_size, self.max_pages_per_seq, dtype=torch.long)
        self.page_table.zero_()

    def get_page_list(self, seq) -> list[int]:
        """The pages of sequence ``seq``, in order."""
        return list(self.allocated_pages.get(seq, []))

    def pre_step(self, step_dict: OrderedDict) -> OrderedDict:
        finished = [seq for seq in self.sequences if seq not in step_dict]
        free = len(self.free_pages) + sum(len(self.allocated_pages[seq]) for seq in finished)
        more = {
            seq: -(-(self.sequences.get(seq, 0) + n) // self.page_size)
            - len(self.allocated_pages.get(seq, ()))
            for seq, n in step_dict.items()
        }
        if sum(more.values()) > free:
            raise RuntimeError(
                f"InferenceParams.pre_step: the paged KV cache is full: this step needs {sum(more.values())} "
                f"more pages of {self.page_size} positions, {free} of total_num_pages={self.total_num_pages} "
                "are free (finished sequences included)"
            )
        for seq in finished:
            self.free_pages.extend(self.allocated_pages.pop(seq))
        self._advance(step_dict)
        for seq, n in more.items():
            pages = self.allocated_pages.setdefault(seq, [])
            pages.extend(self.free_pages.popleft() for _ in range(n))
        self._table.zero_()
        for i, seq in enumerate(self.sequences):
            pages = self.allocated_pages[seq]
            self._table[i, : len(pages)] = torch.tensor(pages, dtype=torch.long)
        self.page_table.copy_(self._table)
        return self.sequences

    def _dst(self, batch: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self._table[batch, pos // self.page_size] * self.page_size + pos % self.page_size

    def step(self, layer_number, new_k, new_v, cu_new_seqlens, cu_cached_seqlens, qkv_format):
        self._check_new(qkv_format, new_k, new_v)
        k_cache, v_cache = self.cache[layer_number]
        src, dst = self._indices(qkv_format, new_k)
        self._write(k_cache, new_k, src, dst)
        self._write(v_cache, new_v, src, dst)
        return k_cache, v_cache


class InferenceParams:
    """A KV cache for generation, TE's class of the same name and arguments (see the module's
    docstring for a step).

    Args:
        max_batch_size: the most sequences a step holds.
        max_sequence_length: the most tokens (prompt and generated) a sequence holds.
        num_heads_kv: key/value heads of an attention layer (per tensor-parallel rank).
        head_dim_k: key channels per head; ``head_dim_v``: value channels (default head_dim_k).
        dtype: the cache's dtype (fp32, bf16 or fp16); new keys and values are cast to it and
            the attention runs in the query's dtype.
        is_paged: a paged cache (``total_num_pages`` pages of ``page_size`` positions, taken by
            sequences as they grow; max_sequence_length a multiple of page_size). Unlike TE, the
            pool may be smaller than max_batch_size full sequences: a step that needs more pages
            than are free raises RuntimeError.
        max_ctx_len: accepted (TE needs it for thd inputs; te reads each step's lengths instead).
        qkv_format: the layout of the incoming tokens, ``"bshd"``, ``"sbhd"`` or ``"thd"``
            (each layer's format is what it passes to ``step``).
        custom_cache_manager: a KVCacheManager subclass to use instead of te's (constructed with
            TE's keyword arguments).
        device: where the cache and its bookkeeping live (default: CUDA when te can run there).

    Attributes (TE's): ``sequences`` ({id: length after this step}, batch order),
    ``sequences_pre_step`` (lengths before), ``batch_size``, ``cu_seqlens_q`` /
    ``cu_seqlens_kv`` (int32 [max_batch_size + 1]: the new tokens' and the whole sequences'
    boundaries, the last repeated past batch_size), ``pre_step_seqlens`` (int32
    [max_batch_size]), ``cache_manager``.
    """

    def __init__(
        self,
        max_batch_size: int,
        max_sequence_length: int,
        num_heads_kv: int | None = None,
        head_dim_k: int | None = None,
        dtype: torch.dtype | None = None,
        head_dim_v: int | None = None,
        is_paged: bool = False,
        total_num_pages: int | None = None,
        page_size: int | None = None,
        max_ctx_len: int | None = None,
        qkv_format: str = "bshd",
        custom_cache_manager: type[KVCacheManager] | None = None,
        device=None,
    ) -> None:
        owner = "InferenceParams"
        self.max_batch_size = _count(owner, "max_batch_size", max_batch_size)
        self.max_sequence_length = _count(owner, "max_sequence_length", max_sequence_length)
        if num_heads_kv is None or head_dim_k is None or dtype is None:
            raise ValueError(
                f"{owner}: num_heads_kv, head_dim_k and dtype: all three are needed (as in TE since 2.2), "
                f"got {num_heads_kv!r}, {head_dim_k!r}, {dtype!r}"
            )
        self.num_heads_kv = _count(owner, "num_heads_kv", num_heads_kv)
        self.head_dim_k = _count(owner, "head_dim_k", head_dim_k)
        self.head_dim_v = self.head_dim_k if head_dim_v is None else _count(owner, "head_dim_v", head_dim_v)
        if dtype not in FLOAT_DTYPES:
            raise ValueError(f"{owner}: dtype: expected torch.float32, bfloat16 or float16, got {dtype!r}")
        self.dtype = dtype
        if qkv_format not in QKV_FORMATS:
            raise ValueError(f"{owner}: qkv_format: expected one of {QKV_FORMATS}, got {qkv_format!r}")
        self.input_qkv_format = qkv_format
        if max_ctx_len is not None:
            self.max_ctx_len = _count(owner, "max_ctx_len", max_ctx_len)
            if self.max_ctx_len > self.max_sequence_length:
                raise ValueError(
                    f"{owner}: max_ctx_len: expected <= max_sequence_length={self.max_sequence_length}, "
                    f"got {max_ctx_len}"
                )
        if custom_cache_manager is not None and not (
            isinstance(custom_cache_manager, type) and issubclass(custom_cache_manager, KVCacheManager)
        ):
            raise TypeError(
                f"{owner}: custom_cache_manager: expected a KVCacheManager subclass, "
                f"got {custom_cache_manager!r}"
            )
        self.device = _device(device)
        self.is_paged = bool(is_paged)
        common = {
            "num_heads": self.num_heads_kv,
            "head_dim_k": self.head_dim_k,
            "dtype": dtype,
            "head_dim_v": self.head_dim_v,
            "max_batch_size": self.max_batch_size,
            "max_seqlen": self.max_sequence_length,
        }
        if self.is_paged:
            self.page_size = _count(owner, "page_size", page_size)
            if self.max_sequence_length % self.page_size:
                raise ValueError(
                    f"{owner}: page_size: expected a divisor of max_sequence_length="
                    f"{self.max_sequence_length}, got {page_size}"
                )
            self.total_num_pages = _count(owner, "total_num_pages", total_num_pages)
            manager = PagedKVCacheManager if custom_cache_manager is None else custom_cache_manager
            common.update(total_num_pages=self.total_num_pages, page_size=self.page_size)
        else:
            manager = NonPagedKVCacheManager if custom_cache_manager is None else custom_cache_manager
        if custom_cache_manager is None:
            common["device"] = self.device
        self.cache_manager = manager(**common)
        self.cache_qkv_format = "bshd"
        self.cu_seqlens_q = torch.zeros(self.max_batch_size + 1, dtype=torch.int32, device=self.device)
        self.cu_seqlens_kv = torch.zeros(self.max_batch_size + 1, dtype=torch.int32, device=self.device)
        self.pre_step_seqlens = torch.zeros(self.max_batch_size, dtype=torch.int32, device=self.device)
        self.reset()

    def reset(self) -> None:
        """Forgets every sequence (the memory stays allocated)."""
        self.sequences: OrderedDict = OrderedDict()
        self.sequences_pre_step: OrderedDict = OrderedDict()
        self.batch_size = 0
        self._uniform = False
        self._shared: dict = {}
        self.max_seqlen_q = 0
        self.max_seqlen_kv = 0
        self.cache_manager.reset()

    def __repr__(self) -> str:
        size = (
            f"total_num_pages={self.total_num_pages}, page_size={self.page_size}"
            if self.is_paged
            else f"max_batch_size={self.max_batch_size}, max_sequence_length={self.max_sequence_length}"
        )
        return (
            f"InferenceParams(dtype={self.dtype}, is_paged={self.is_paged}, {size}, num_heads_kv="
            f"{self.num_heads_kv}, head_dim_k={self.head_dim_k}, head_dim_v={self.head_dim_v})"
        )

    def allocate_memory(self, layer_number: int) -> None:
        """Allocates layer ``layer_number``'s cache (te.MultiheadAttention does it at its first
        step): non-paged k [max_batch_size, max_sequence_length, num_heads_kv, head_dim_k],
        paged k [total_num_pages, page_size, num_heads_kv, head_dim_k]; v likewise."""
        self.cache_manager.allocate_memory(layer_number)

    def pre_step(self, step_dict: Mapping) -> None:
        """Starts a step: ``step_dict`` maps each sequence id of the step, in batch order, to
        its number of new tokens (a new id's prompt, a known id's continuation). Known ids left
        out are finished and freed."""
        owner = "InferenceParams.pre_step"
        if not isinstance(step_dict, Mapping) or not step_dict:
            raise ValueError(f"{owner}: step_dict: expected a non-empty {{sequence id: new tokens}} mapping")
        if len(step_dict) > self.max_batch_size:
            raise ValueError(
                f"{owner}: step_dict: {len(step_dict)} sequences, max_batch_size={self.max_batch_size}"
            )
        for seq, n in step_dict.items():
            _count(owner, f"step_dict[{seq!r}]", n)
            total = self.sequences.get(seq, 0) + n
            if total > self.max_sequence_length:
                raise ValueError(
                    f"{owner}: step_dict[{seq!r}]: sequence {seq!r} would hold {total} tokens, "
                    f"max_sequence_length={self.max_sequence_length}"
                )
        pre = OrderedDict((seq, self.sequences.get(seq, 0)) for seq in step_dict)
        self._shared = {}
        self.sequences = self.cache_manager.pre_step(OrderedDict(step_dict))
        self.sequences_pre_step = pre
        self.batch_size = b = len(step_dict)
        steps = list(step_dict.values())
        lens = list(self.sequences.values())
        self.max_seqlen_q, self.max_seqlen_kv = max(steps), max(lens)
        self._uniform = len(set(steps)) == 1 and len(set(pre.values())) == 1
        host = torch.zeros(3, self.max_batch_size + 1, dtype=torch.long)
        host[0, 1 : b + 1] = torch.tensor(steps).cumsum(0)
        host[1, 1 : b + 1] = torch.tensor(lens).cumsum(0)
        host[0, b + 1 :] = host[0, b]
        host[1, b + 1 :] = host[1, b]
        host[2, :b] = torch.tensor(list(pre.values()))
        dev = host.to(self.device)
        self.cu_seqlens_q.copy_(dev[0])
        self.cu_seqlens_kv.copy_(dev[1])
        self.pre_step_seqlens.copy_(dev[2, :-1])

    def get_seqlens_pre_step(self) -> torch.Tensor:
        """Each batch entry's length before this step, int32 [max_batch_size] (RoPE's start
        positions)."""
        return self.pre_step_seqlens

    def step(self, layer_number: int, new_k: torch.Tensor, new_v: torch.Tensor, qkv_format: str):
        """Writes layer ``layer_number``'s new keys and values (``qkv_format``: bshd [b, s, g, d]
        or sbhd [s, b, g, d] with each sequence's new tokens first, or thd [t, g, d] packed by
        ``cu_seqlens_q``) into the cache.

        Returns (k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_kv, qkv_format): k / v bshd
        [batch_size, max_seqlen_kv, g, d] in the cache's dtype, each sequence's tokens first
        (positions past a sequence's length hold stale values: mask them with cu_seqlens_kv);
        qkv_format is the queries' format with the cache's, e.g. ``"sbhd_2bshd"``.
        """
        owner = "InferenceParams.step"
        if qkv_format not in QKV_FORMATS:
            raise ValueError(f"{owner}: qkv_format: expected one of {QKV_FORMATS}, got {qkv_format!r}")
        if not self.batch_size:
            raise RuntimeError(f"{owner}: call pre_step(step_dict) before the model's forward")
        if layer_number not in self.cache_manager.cache:
            raise ValueError(
                f"{owner}: layer_number={layer_number!r} has no cache: call "
                f"allocate_memory({layer_number!r}) first"
            )
        if torch.is_grad_enabled() and (new_k.requires_grad or new_v.requires_grad):
            info_once(
                "kv_cache_grad",
                "te.InferenceParams: keys and values enter the KV cache detached (it is for inference: "
                "no gradient flows through the cache)",
            )
        k, v = self.cache_manager.step(
            layer_number, new_k, new_v, self.cu_seqlens_q, self.cu_seqlens_kv, qkv_format
        )
        b, s = self.batch_size, self.max_seqlen_kv
        if getattr(self.cache_manager, "page_table", None) is not None and self.is_paged:
            pages = math.ceil(s / self.page_size)
            table = self.cache_manager.page_table[:b, :pages].long()
            k, v = (x[table].flatten(1, 2) for x in (k, v))
        out_format = qkv_format if qkv_format == "bshd" else f"{qkv_format}_2bshd"
        return k[:b, :s], v[:b, :s], self.cu_seqlens_q, self.cu_seqlens_kv, s, out_format

    def convert_paged_to_nonpaged(self, layer_number: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer_number``'s paged cache as non-paged [batch_size, max_sequence_length,
        kv heads, channels] copies (TE's method)."""
        if not self.is_paged:
            raise ValueError(
                "InferenceParams.convert_paged_to_nonpaged: is_paged=False: the cache is not paged"
            )
        k, v = self.cache_manager.cache[layer_number]
        table = self.cache_manager.page_table[: self.batch_size].long()
        return k[table].flatten(1, 2), v[table].flatten(1, 2)

    def _valid(self, sq: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(valid_q [b, sq], valid_kv [b, max_seqlen_kv]) bools: each batch entry's new tokens
        among sq query positions and its whole sequence in the cache."""

        def make():
            b = self.batch_size
            lens_q = self.cu_seqlens_q[1 : b + 1] - self.cu_seqlens_q[:b]
            lens_kv = self.cu_seqlens_kv[1 : b + 1] - self.cu_seqlens_kv[:b]
            q = torch.arange(sq, device=self.device)[None, :] < lens_q[:, None]
            kv = torch.arange(self.max_seqlen_kv, device=self.device)[None, :] < lens_kv[:, None]
            return q, kv

        return self._share(("valid", sq), make)

    def _share(self, key, make):
        """make(), computed once a step for every layer that asks with the same key (the step's
        masks depend on its lengths only)."""
        if key not in self._shared:
            self._shared[key] = make()
        return self._shared[key]


def _describe(x) -> str:
    return f"{x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
