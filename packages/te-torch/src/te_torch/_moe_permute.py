"""TE's mixture-of-experts token permutation helpers (``transformer_engine.pytorch``'s
``moe_permute``, ``moe_permute_with_probs``, ``moe_permute_and_pad_with_probs``, ``moe_unpermute``,
``moe_sort_chunks_by_index`` and ``moe_sort_chunks_by_index_with_probs``), with TE's names,
arguments and defaults; Megatron-LM calls them with ``moe_permute_fusion=True``.

The permuted order (TE's): rows grouped by expert in ascending expert order, each expert's rows in
ascending token order (an index map's slots of one token naming the same expert, by slot). A
``num_out_tokens`` below the routed count keeps the first ``num_out_tokens`` rows of that order:
the tokens dropped are the last ones routed to the highest experts. One above it appends zero
rows, which take no gradient and which ``moe_unpermute`` ignores.

``row_id_map`` is opaque: pass it back to ``moe_unpermute`` unchanged. (It is an int32
[num_tokens, S] table, S = num_experts for a mask map and topK for an index map, holding each
(token, slot)'s permuted row or -1 where the slot is not routed or was dropped; TE's differs.)

Everything is index arithmetic in torch ops on the inputs' device (a cumulative count and
``searchsorted`` for a mask map, a stable ``argsort`` for an index map), row gathers, and fp32
``index_add_`` where rows are summed (a token's expert outputs, a token's row gradients), in
permuted-row order as TE's kernels sum. No Python loop runs over tokens and no device value is
read on the host, but for a mask map with ``num_out_tokens=-1`` (the output's row count is the
routed count) and in ``moe_permute_and_pad_with_probs`` (the padded row count, as in TE). Argument
values that only the device knows (index ranges, chunk sizes) are checked for CPU tensors only,
where reading them costs no synchronization.

Padding (``moe_permute_and_pad_with_probs``): each expert's group of rows is followed by zero rows
up to a multiple of ``align_size``; ``pad_offsets[e]`` is the padding rows before expert e's group
(the pads of experts 0..e-1), so a slot's padded row is its ``row_id_map`` row plus its expert's
offset. ``row_id_map`` stays the unpadded one (``moe_permute_with_probs``'s), as in TE, and
``moe_unpermute(..., pad_offsets=)`` adds the offsets back.

Quantized inputs: ``moe_permute*`` (with probs, padded) and ``moe_sort_chunks_by_index*`` move
the rows of a te quantized tensor's row-wise copy and its row-wise scales, exactly (the same
bytes): ``Float8Tensor`` (its scale shared; a tensor with only the transposed copy is read through
it), ``Float8BlockwiseQTensor`` with 1x128 blocks, ``MXFP8Tensor`` and ``NVFP4Tensor`` with 1-D
blocks (NVFP4's global amaxes kept). The result has the row-wise copy only, as TE's: column-wise
blocks span tokens. 128x128 / 2-D tiles span tokens too and raise NotImplementedError.
``moe_unpermute`` sums rows, so it dequantizes a quantized input (TE refuses one). Gradients are
high precision in the input's dtype.
"""

from __future__ import annotations

import operator
import warnings

import torch
from te_core import _C

from te_torch._blockwise_tensor import Float8BlockwiseQTensor
from te_torch._float8_tensor import Float8Tensor
from te_torch._mx_tensor import MXFP8Tensor, NVFP4Tensor, part_shape
from te_torch._quantized_tensor import QuantizedTensor

__all__ = [
    "moe_permute",
    "moe_permute_with_probs",
    "moe_permute_and_pad_with_probs",
    "moe_unpermute",
    "moe_sort_chunks_by_index",
    "moe_sort_chunks_by_index_with_probs",
]

_FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_MAP_TYPES = ("mask", "index")
_BLOCK_1D = int(_C.ScalingMode.BLOCK_1D)
_PART_RS = int(_C.Part.ROWWISE_SCALE_INV)


# -- argument checks ------------------------------------------------------------------------------


def _tensor(owner: str, name: str, t, device: torch.device | None = None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{owner}: {name}: expected a torch.Tensor, got {type(t).__name__}")
    if device is not None and t.device != device:
        raise ValueError(
            f"{owner}: {name}: expected a tensor on {device} (inp's device), got one on {t.device}"
        )
    return t


def _check_inp(owner: str, inp) -> None:
    _tensor(owner, "inp", inp)
    if inp.dim() != 2:
        raise ValueError(
            f"{owner}: inp: expected a 2-D tensor [num_tokens, hidden_size], got shape {tuple(inp.shape)}"
        )
    if inp.dtype not in _FLOATS:
        raise TypeError(f"{owner}: inp: expected float32, bfloat16, float16 or float64, got {inp.dtype}")


def _check_probs(owner: str, name: str, probs, shape: tuple, device: torch.device, what: str) -> torch.Tensor:
    _tensor(owner, name, probs, device)
    if not probs.dtype.is_floating_point:
        raise TypeError(f"{owner}: {name}: expected a floating-point tensor, got {probs.dtype}")
    if tuple(probs.shape) != shape:
        raise ValueError(f"{owner}: {name}: expected shape {list(shape)} ({what}), got {tuple(probs.shape)}")
    return probs


def _int(owner: str, name: str, v, what: str) -> int:
    if isinstance(v, bool):
        raise TypeError(f"{owner}: {name}: expected an int ({what}), got {v!r}")
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"{owner}: {name}: expected an int ({what}), got {type(v).__name__} {v!r}") from None


def _map_type(owner: str, map_type) -> str:
    if map_type not in _MAP_TYPES:
        raise ValueError(f"{owner}: map_type: expected 'mask' or 'index', got {map_type!r}")
    return map_type


def _host_values(t: torch.Tensor) -> bool:
    """Whether ``t``'s values can be checked without a device synchronization (or a graph break)."""
    return t.device.type == "cpu" and not torch.compiler.is_compiling()


def _check_routing_map(owner: str, routing_map, num_tokens: int, device, map_type: str) -> torch.Tensor:
    _tensor(owner, "routing_map", routing_map, device)
    layout = "[num_tokens, num_experts] mask" if map_type == "mask" else "[num_tokens, topK] expert indices"
    if routing_map.dim() != 2 or routing_map.shape[0] != num_tokens:
        raise ValueError(
            f"{owner}: routing_map: expected a {layout} with num_tokens={num_tokens} (inp's rows), got "
            f"shape {tuple(routing_map.shape)}"
        )
    dt = routing_map.dtype
    if dt.is_floating_point or dt.is_complex or (map_type == "index" and dt == torch.bool):
        want = "a bool or integer" if map_type == "mask" else "an integer"
        raise TypeError(f"{owner}: routing_map: expected {want} tensor ({layout}), got {dt}")
    if map_type == "index" and _host_values(routing_map) and routing_map.numel() and routing_map.min() < 0:
        raise ValueError(f"{owner}: routing_map: expected expert indices >= 0, got {int(routing_map.min())}")
    return routing_map


# -- row maps -------------------------------------------------------------------------------------
# A permutation is described by, for each permuted row, its source token (num_tokens where the row
# has none: a zero row) and its slot, the flat index token * S + s into the [num_tokens, S] routing
# table (-1 where none); row_id_map is the inverse, the permuted row of each slot.


def _mask_rows(routing_map: torch.Tensor, num_out: int):
    """(row_id_map, row_token, row_slot, may_fill) of a [T, E] mask; may_fill: rows past the
    routed count are possible."""
    t, e = routing_map.shape
    dev = routing_map.device
    routed = routing_map if routing_map.dtype == torch.bool else routing_map != 0
    expert_major = routed.t().reshape(-1)
    count = expert_major.cumsum(0)  # count[i]: routed slots up to slot i of the expert-major order
    may_fill = num_out >= 0
    if num_out < 0:
        num_out = int(count[-1]) if count.numel() else 0  # the output's rows: the one host sync
    rank = torch.where(expert_major, count - 1, -1)
    rank = rank.masked_fill(rank >= num_out, -1)
    row_id_map = rank.view(e, t).t().to(torch.int32).contiguous()
    if count.numel() == 0:
        row_token = torch.full((num_out,), t, dtype=torch.long, device=dev)
        return row_id_map, row_token, torch.full_like(row_token, -1), may_fill
    # row r comes from the slot where the count first reaches r + 1
    pos = torch.searchsorted(count, torch.arange(1, num_out + 1, device=dev))
    held = pos < count.numel()
    token, expert = pos % t, pos // t
    row_token = torch.where(held, token, t)
    row_slot = torch.where(held, token * e + expert, -1)
    return row_id_map, row_token, row_slot, may_fill


def _index_rows(index: torch.Tensor, num_out: int):
    """(row_id_map, row_token, row_slot, may_fill) of a [T, K] expert-index table."""
    t, k = index.shape
    dev = index.device
    n = t * k
    num_out = n if num_out < 0 else num_out
    order = torch.argsort(index.reshape(-1), stable=True)  # slots by expert, then token, then k
    rank = torch.empty_like(order).scatter_(0, order, torch.arange(n, device=dev))
    row_id_map = rank.masked_fill(rank >= num_out, -1).view(t, k).to(torch.int32)
    row_slot = order[:num_out]
    row_token = row_slot // k if n else row_slot
    if num_out > n:
        pad = num_out - n
        row_token = torch.cat([row_token, torch.full((pad,), t, dtype=torch.long, device=dev)])
        row_slot = torch.cat([row_slot, torch.full((pad,), -1, dtype=torch.long, device=dev)])
    return row_id_map, row_token, row_slot, num_out > n


def _slot_of_row(row_id_map: torch.Tensor, num_rows: int) -> torch.Tensor:
    """For each of ``num_rows`` permuted rows, the slot row_id_map sends there (-1: none)."""
    n = row_id_map.numel()
    dev = row_id_map.device
    flat = row_id_map.reshape(-1).long()
    slots = torch.arange(n, device=dev)
    # slots not sent to a row go to a scratch index of their own, so every target is distinct
    target = torch.where((flat >= 0) & (flat < num_rows), flat, num_rows + slots)
    out = torch.full((num_rows + n,), -1, dtype=torch.long, device=dev)
    return out.scatter_(0, target, slots)[:num_rows]


def _chunk_rows(sizes: torch.Tensor, order: torch.Tensor, num_rows: int) -> torch.Tensor:
    """For each output row of the chunks reordered, its input row."""
    in_start = sizes.cumsum(0) - sizes
    out_sizes = sizes.index_select(0, order)
    out_end = out_sizes.cumsum(0)
    r = torch.arange(num_rows, device=sizes.device)
    j = torch.searchsorted(out_end, r, right=True).clamp_(max=order.numel() - 1)
    src = in_start.index_select(0, order.index_select(0, j)) + r - (out_end - out_sizes).index_select(0, j)
    # in bounds even for sizes that do not add up (checked on the host for CPU tensors only)
    return src.clamp_(0, max(num_rows - 1, 0))


# -- rows -----------------------------------------------------------------------------------------


def _take_rows(x: torch.Tensor, token: torch.Tensor, num_tokens: int, zero: torch.Tensor | None):
    """x[token] for a 2-D x; rows where ``zero`` is set are zeros (token == num_tokens: no row)."""
    if num_tokens == 0:
        return x.new_zeros((token.numel(), *x.shape[1:]))
    out = x.index_select(0, token.clamp(max=num_tokens - 1))
    if zero is not None:
        out.masked_fill_(zero.unsqueeze(-1), 0)
    return out


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _sum_rows(x: torch.Tensor, token: torch.Tensor, num_tokens: int, weight=None) -> torch.Tensor:
    """out[t] = sum of weight[r] * x[r] over the rows r with token[r] == t, summed in fp32 in row
    order (rows with token == num_tokens are left out), in x's dtype."""
    acc = _acc_dtype(x.dtype)
    src = x.to(acc)
    if weight is not None:
        src = src * weight.to(acc).unsqueeze(-1)
    out = torch.zeros((num_tokens + 1, x.shape[1]), dtype=acc, device=x.device)
    return out.index_add_(0, token, src)[:num_tokens].to(x.dtype)


def _scatter_slots(values: torch.Tensor, row_slot: torch.Tensor, shape: tuple, dtype) -> torch.Tensor:
    """A [T, S] table, zero but at each row's slot, which gets that row's value."""
    n = shape[0] * shape[1]
    out = torch.zeros(n + 1, dtype=values.dtype, device=values.device)
    out.index_add_(0, torch.where(row_slot >= 0, row_slot, n), values)
    return out[:n].view(shape).to(dtype)


def _flat_at(v: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """v.flatten()[slot], 0 where slot < 0."""
    flat = v.reshape(-1)
    if flat.numel() == 0:
        return flat.new_zeros(slot.shape)
    return flat.index_select(0, slot.clamp(min=0)).masked_fill_(slot < 0, 0)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    # FP8 element types lack some CPU kernels (masked_fill); the bytes have them all
    return t.view(torch.uint8) if t.element_size() == 1 else t


def _quantized_rows(owner: str, t: QuantizedTensor, token, num_tokens: int, zero) -> QuantizedTensor:
    """The quantized ``t`` with its rows taken as _take_rows does, bytes and row-wise scales."""
    n, k = token.numel(), t.shape[1]

    def rows(x):
        return _take_rows(_bytes(x), token, num_tokens, zero).view(x.dtype)

    name = type(t).__name__
    if isinstance(t, Float8Tensor):
        data = t._data if t._data is not None else t._transpose.t()
        if tuple(data.shape) != (num_tokens, k):
            raise NotImplementedError(
                f"{owner}: inp: a {name} view of other bytes; pass a [num_tokens, hidden] tensor"
            )
        return Float8Tensor(
            shape=(n, k),
            dtype=t.dtype,
            data=rows(data),
            fp8_scale_inv=t._scale_inv,
            fp8_dtype=t._fp8_dtype,
            quantizer=t._quantizer,
        )
    if isinstance(t, (Float8BlockwiseQTensor, MXFP8Tensor, NVFP4Tensor)):
        tiles = t._is_2D_scaled if isinstance(t, Float8BlockwiseQTensor) else t._with_2d_quantization
        if tiles:
            raise NotImplementedError(
                f"{owner}: inp: a {name} with 2-D blocks cannot have its rows moved exactly (a block's "
                "scale spans several tokens); quantize activations with 1-D blocks, or pass them in high "
                "precision"
            )
        rd, rs = t._rowwise_data, t._rowwise_scale_inv
        if rd is None:
            raise NotImplementedError(
                f"{owner}: inp: a {name} without its row-wise copy cannot have its rows moved exactly "
                "(the column-wise copy's blocks span several tokens); quantize it with rowwise=True"
            )
        if rd.shape[0] != num_tokens or rd.dim() != 2:
            raise NotImplementedError(
                f"{owner}: inp: a {name} view of other bytes; pass a [num_tokens, hidden] tensor"
            )
        if isinstance(t, Float8BlockwiseQTensor):  # scales stored transposed: one column a token
            table = rs.new_zeros(tuple(_C.quantized_shape(_BLOCK_1D, _PART_RS, (n, k))))
            table[:, :n] = _take_rows(rs[:, :num_tokens].t(), token, num_tokens, None).t()
            return t._like(rows(rd), table, None, None, shape=(n, k))
        table = rs.new_zeros(part_shape(t._mode, _PART_RS, (n, k)))
        table[:n] = _take_rows(rs[:num_tokens, : table.shape[1]], token, num_tokens, None)
        return t._like(rows(rd), table, None, None, t._own_amax(), shape=(n, k))
    raise NotImplementedError(f"{owner}: inp: moving the rows of a {name} is not implemented")


def _gather(owner: str, x: torch.Tensor, token, num_tokens: int, zero) -> torch.Tensor:
    if isinstance(x, QuantizedTensor):
        return _quantized_rows(owner, x, token, num_tokens, zero)
    return _take_rows(x, token, num_tokens, zero)


def _plain(t: torch.Tensor) -> torch.Tensor:
    return t.dequantize() if isinstance(t, QuantizedTensor) else t


# -- autograd Functions ---------------------------------------------------------------------------


class _Permute(torch.autograd.Function):
    """out[r] = inp[row_token[r]], permuted_probs[r] = probs.flat[row_slot[r]]; zero rows where
    the row has no token and, with probs, where its probability is 0."""

    @staticmethod
    def forward(ctx, inp, probs, row_token, row_slot, may_fill: bool, owner: str):
        num_tokens = inp.shape[0]
        permuted_probs = zero = None
        if probs is not None:
            permuted_probs = _flat_at(probs, row_slot)
            # TE: a routed slot of probability 0 is padding (Megatron's drop-and-pad): a zero row
            zero = permuted_probs == 0
        elif may_fill:
            zero = row_token == num_tokens
        out = _gather(owner, inp, row_token, num_tokens, zero)
        bwd_token = row_token if zero is None else row_token.masked_fill(zero, num_tokens)
        ctx.save_for_backward(bwd_token, row_slot if probs is not None else None)
        ctx.num_tokens, ctx.dtype = num_tokens, inp.dtype
        ctx.probs_shape = None if probs is None else (tuple(probs.shape), probs.dtype)
        return out, permuted_probs

    @staticmethod
    def backward(ctx, grad_out, grad_probs):
        bwd_token, row_slot = ctx.saved_tensors
        grad_inp = grad_p = None
        if ctx.needs_input_grad[0]:
            grad_inp = _sum_rows(_plain(grad_out).to(ctx.dtype), bwd_token, ctx.num_tokens)
        if ctx.needs_input_grad[1] and grad_probs is not None:
            shape, dtype = ctx.probs_shape
            grad_p = _scatter_slots(grad_probs, row_slot, shape, dtype)
        return grad_inp, grad_p, None, None, None, None


class _Unpermute(torch.autograd.Function):
    """out[t] = sum over the permuted rows r of token t of merging_probs.flat[slot(r)] * inp[r]
    (weights 1 without merging_probs); rows no slot points at are left out."""

    @staticmethod
    def forward(ctx, inp, row_id_map, merging_probs):
        num_tokens, s = row_id_map.shape
        slot = _slot_of_row(row_id_map, inp.shape[0])
        row_token = torch.where(slot >= 0, slot // max(s, 1), num_tokens)
        weight = None
        if merging_probs is not None:
            weight = _flat_at(merging_probs, slot)
        out = _sum_rows(_plain(inp), row_token, num_tokens, weight)
        ctx.save_for_backward(
            row_token,
            slot,
            inp if merging_probs is not None and ctx.needs_input_grad[2] else None,
            weight,
        )
        ctx.num_tokens, ctx.dtype = num_tokens, inp.dtype
        ctx.probs_shape = None if merging_probs is None else (tuple(merging_probs.shape), merging_probs.dtype)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        row_token, slot, inp, weight = ctx.saved_tensors
        num_tokens = ctx.num_tokens
        rows = _take_rows(_plain(grad_out).to(ctx.dtype), row_token, num_tokens, row_token == num_tokens)
        grad_inp = grad_p = None
        if ctx.needs_input_grad[0]:
            grad_inp = rows
            if weight is not None:  # the product in fp32, rounded once (TE's kernel)
                acc = _acc_dtype(ctx.dtype)
                grad_inp = (rows.to(acc) * weight.to(acc).unsqueeze(-1)).to(ctx.dtype)
        if ctx.needs_input_grad[2]:
            acc = _acc_dtype(ctx.dtype)
            dots = (rows.to(acc) * _plain(inp).to(acc)).sum(-1)
            shape, dtype = ctx.probs_shape
            grad_p = _scatter_slots(dots, slot, shape, dtype)
        return grad_inp, None, grad_p


class _SortChunks(torch.autograd.Function):
    """out = the chunks of inp (split_sizes rows each) in sorted_index's order; probs alike."""

    @staticmethod
    def forward(ctx, inp, probs, sizes, order, owner: str):
        num_tokens = inp.shape[0]
        src = (
            _chunk_rows(sizes, order, num_tokens)
            if order.numel()
            else torch.arange(num_tokens, device=inp.device)
        )
        out = _gather(owner, inp, src, num_tokens, None)
        permuted_probs = None if probs is None else probs.index_select(0, src)
        ctx.save_for_backward(src)
        ctx.dtype = inp.dtype
        return out, permuted_probs

    @staticmethod
    def backward(ctx, grad_out, grad_probs):
        (src,) = ctx.saved_tensors
        dest = torch.empty_like(src).scatter_(0, src, torch.arange(src.numel(), device=src.device))
        grad_inp = grad_p = None
        if ctx.needs_input_grad[0]:
            grad_inp = _plain(grad_out).to(ctx.dtype).index_select(0, dest)
        if ctx.needs_input_grad[1] and grad_probs is not None:
            grad_p = grad_probs.index_select(0, dest)
        return grad_inp, grad_p, None, None, None


# -- public functions -----------------------------------------------------------------------------


def _permute(owner, inp, probs, routing_map, num_out_tokens, map_type):
    _check_inp(owner, inp)
    num_out = _int(owner, "num_out_tokens", num_out_tokens, "-1: every routed token")
    routing_map = _check_routing_map(owner, routing_map, inp.shape[0], inp.device, map_type)
    if probs is not None:
        _check_probs(owner, "probs", probs, tuple(routing_map.shape), inp.device, "routing_map's shape")
    rows = _mask_rows if map_type == "mask" else _index_rows
    row_id_map, row_token, row_slot, may_fill = rows(routing_map, num_out)
    out, permuted_probs = _Permute.apply(inp, probs, row_token, row_slot, may_fill, owner)
    return out, permuted_probs, row_id_map


def moe_permute(
    inp: torch.Tensor,
    routing_map: torch.Tensor,
    num_out_tokens: int = -1,
    max_token_num: int = -1,
    map_type: str = "mask",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Copies each token's row to every expert it is routed to, grouped by expert (TE's
    ``moe_permute``). Returns ``(permuted, row_id_map)``.

    Args:
        inp: ``[num_tokens, hidden_size]`` tokens, float32 / bfloat16 / float16 (or float64), or a
            te quantized tensor (module docstring: which, and how).
        routing_map: with ``map_type="mask"``, ``[num_tokens, num_experts]`` bool or integer, nonzero
            where the token goes to the expert; with ``"index"``, ``[num_tokens, topK]`` integer
            expert indices (>= 0).
        num_out_tokens: the rows of ``permuted``: the first ``num_out_tokens`` rows of the permuted
            order are kept (module docstring). -1 (default): every routed slot; with a mask map
            that count is read from the device (one synchronization), with an index map it is
            ``num_tokens * topK``.
        max_token_num: TE's workspace hint; te needs no workspace and only checks it is an int.
        map_type: ``"mask"`` or ``"index"``, as above.

    Returns:
        ``permuted`` ``[num_out_tokens, hidden_size]`` (rows by expert, then token) and
        ``row_id_map``, opaque: pass it to ``moe_unpermute``.
    """
    owner = "moe_permute"
    _int(owner, "max_token_num", max_token_num, "TE's workspace hint")
    _map_type(owner, map_type)
    out, _, row_id_map = _permute(owner, inp, None, routing_map, num_out_tokens, map_type)
    return out, row_id_map


def moe_permute_with_probs(
    inp: torch.Tensor,
    probs: torch.Tensor,
    routing_map: torch.Tensor,
    num_out_tokens: int = -1,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``moe_permute`` with a mask map that moves each routed slot's probability along with its
    row (TE's ``moe_permute_with_probs``). Returns ``(permuted, permuted_probs, row_id_map)``.

    Args:
        inp: ``[num_tokens, hidden_size]`` tokens, as for ``moe_permute``.
        probs: ``[num_tokens, num_experts]`` floating router probabilities.
        routing_map: ``[num_tokens, num_experts]`` bool or integer mask.
        num_out_tokens: as for ``moe_permute``.

    Returns:
        ``permuted``, ``permuted_probs`` ``[num_out_tokens]`` (probs' dtype) and ``row_id_map``.
        As in TE, a routed slot whose probability is exactly 0 (Megatron's capacity padding)
        gets a zero row (and passes no gradient to its token).
    """
    owner = "moe_permute_with_probs"
    _tensor(owner, "probs", probs)
    return _permute(owner, inp, probs, routing_map, num_out_tokens, "mask")


def _padded_layout(owner, routing_map, tokens_per_expert, align: int, device):
    """(row_id_map, row_token, row_slot, pad_offsets, target) of the padded layout: the unpadded
    rows (``_mask_rows``), each moved down by its expert's pad offset, pad rows without a token.
    The one host read: the routed and padded row counts and the check of tokens_per_expert."""
    t, e = routing_map.shape
    routed = routing_map if routing_map.dtype == torch.bool else routing_map != 0
    counts = routed.sum(0)
    tpe = tokens_per_expert.to(device=device, dtype=torch.long, non_blocking=True)
    target = (tpe + (align - 1)).div(align, rounding_mode="floor") * align
    pad = target - tpe
    wrong = tpe != counts
    num_routed, num_out, num_wrong, num_pad = torch.stack(
        [counts.sum(), target.sum(), wrong.sum(), pad.sum()]
    ).tolist()  # the synchronization: the output's row count (TE's .item())
    if num_wrong:
        ex = int(wrong.nonzero()[0, 0])
        raise ValueError(
            f"{owner}: tokens_per_expert: expected each expert's routed token count "
            f"(routing_map.sum(0)); expert {ex} has {int(counts[ex])}, got {int(tpe[ex])}"
        )
    row_id_map, row_token, row_slot, _ = _mask_rows(routing_map, num_routed)
    if num_pad == 0:  # every group aligned already: TE returns no pad_offsets
        return row_id_map, row_token, row_slot, None, target
    pad_offsets = pad.cumsum(0) - pad
    dest = torch.arange(num_routed, device=device) + pad_offsets.index_select(0, row_slot % e)
    token = torch.full((num_out,), t, dtype=torch.long, device=device).index_copy_(0, dest, row_token)
    slot = torch.full((num_out,), -1, dtype=torch.long, device=device).index_copy_(0, dest, row_slot)
    return row_id_map, token, slot, pad_offsets, target


def moe_permute_and_pad_with_probs(
    inp: torch.Tensor,
    probs: torch.Tensor,
    routing_map: torch.Tensor,
    tokens_per_expert: torch.Tensor,
    align_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """``moe_permute_with_probs`` with each expert's group of rows padded with zero rows (and zero
    probabilities) up to a multiple of ``align_size``, so grouped / FP8 GEMMs get aligned group
    sizes (TE's ``moe_permute_and_pad_with_probs``: ``moe_permute_with_probs`` and ``Fp8Padding``
    in one). Returns ``(permuted, permuted_probs, row_id_map, pad_offsets,
    target_tokens_per_expert)``.

    Args:
        inp: ``[num_tokens, hidden_size]`` tokens, as for ``moe_permute`` (quantized too).
        probs: ``[num_tokens, num_experts]`` floating router probabilities.
        routing_map: ``[num_tokens, num_experts]`` bool or integer mask.
        tokens_per_expert: ``[num_experts]`` integer tensor, each expert's routed token count
            (``routing_map.sum(0)``; any device); checked against ``routing_map``.
        align_size: int >= 1, the row multiple of each expert's group.

    Returns:
        ``permuted`` ``[sum(target_tokens_per_expert), hidden_size]``: expert e's rows (token
        order), then its zero pad rows, then expert e + 1's; ``permuted_probs`` likewise (0 on pad
        rows); ``row_id_map``, the unpadded one (``moe_permute_with_probs``'s); ``pad_offsets``
        (int64 ``[num_experts]``, the pad rows before each expert's group) or None when no group
        needs padding; ``target_tokens_per_expert`` (int64 ``[num_experts]``, the padded counts).
        Pass ``pad_offsets`` to ``moe_unpermute`` with ``row_id_map``. The padded row count is read
        from the device (one synchronization, as in TE). Pad rows take no gradient.
    """
    owner = "moe_permute_and_pad_with_probs"
    _check_inp(owner, inp)
    _tensor(owner, "probs", probs)
    routing_map = _check_routing_map(owner, routing_map, inp.shape[0], inp.device, "mask")
    _check_probs(owner, "probs", probs, tuple(routing_map.shape), inp.device, "routing_map's shape")
    _tensor(owner, "tokens_per_expert", tokens_per_expert)
    _per_expert(owner, "tokens_per_expert", tokens_per_expert, routing_map.shape[1], "routing_map.sum(0)")
    align = _int(owner, "align_size", align_size, "the row multiple of each expert's group")
    if align < 1:
        raise ValueError(
            f"{owner}: align_size: expected an int >= 1 (the row multiple of each expert's group), "
            f"got {align}"
        )
    row_id_map, row_token, row_slot, pad_offsets, target = _padded_layout(
        owner, routing_map, tokens_per_expert, align, inp.device
    )
    out, permuted_probs = _Permute.apply(inp, probs, row_token, row_slot, True, owner)
    return out, permuted_probs, row_id_map, pad_offsets, target


def _per_expert(owner: str, arg: str, t: torch.Tensor, num_experts: int, what: str) -> None:
    """``t`` an integer tensor [num_experts] (``what``: where it comes from)."""
    dt = t.dtype
    if dt.is_floating_point or dt.is_complex or dt == torch.bool:
        raise TypeError(f"{owner}: {arg}: expected an integer tensor ({what}), got {dt}")
    if tuple(t.shape) != (num_experts,):
        raise ValueError(
            f"{owner}: {arg}: expected shape [{num_experts}] (one per expert, {what}), got {tuple(t.shape)}"
        )


def _padded_rows(owner, row_id_map, pad_offsets, device, map_type: str) -> torch.Tensor:
    """row_id_map with each kept slot's row moved down by its expert's pad offset."""
    _tensor(owner, "pad_offsets", pad_offsets, device)
    if map_type != "mask":
        raise ValueError(
            f"{owner}: pad_offsets: expected None with map_type='index' (moe_permute_and_pad_with_probs "
            "pads mask-map permutations only)"
        )
    _per_expert(owner, "pad_offsets", pad_offsets, row_id_map.shape[1], "moe_permute_and_pad_with_probs's")
    if _host_values(pad_offsets) and pad_offsets.numel() and int(pad_offsets.min()) < 0:
        raise ValueError(f"{owner}: pad_offsets: expected offsets >= 0, got {int(pad_offsets.min())}")
    return torch.where(row_id_map >= 0, row_id_map.long() + pad_offsets.long(), -1)


def moe_unpermute(
    inp: torch.Tensor,
    row_id_map: torch.Tensor,
    merging_probs: torch.Tensor | None = None,
    restore_shape: torch.Size | None = None,
    map_type: str = "mask",
    probs: torch.Tensor | None = None,
    pad_offsets: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sums each token's permuted rows back into its place, weighted by ``merging_probs`` (TE's
    ``moe_unpermute``): ``out[t] = sum_e merging_probs[t, e] * inp[row of (t, e)]`` over the
    token's kept slots, accumulated in fp32.

    Args:
        inp: ``[num_out_tokens, hidden_size]`` permuted rows (a quantized tensor is dequantized).
        row_id_map: ``moe_permute``'s, unchanged.
        merging_probs: ``[num_tokens, num_experts]`` (mask map) or ``[num_tokens, topK]`` (index
            map) weights; None sums the rows as they are. Its gradient is returned.
        restore_shape: ``(num_tokens, hidden_size)``, checked against ``row_id_map`` and ``inp``;
            None (default) takes it from them.
        map_type: ``"mask"`` or ``"index"``; te's ``row_id_map`` records what it needs, so it is
            only checked.
        probs: the old name of ``merging_probs`` (deprecated, as in TE).
        pad_offsets: ``moe_permute_and_pad_with_probs``'s (mask map only): each expert's rows sit
            that many rows further down in ``inp``; its pad rows are left out (no gradient).

    Returns:
        ``[num_tokens, hidden_size]`` in inp's dtype; tokens with no kept slot are zeros.
    """
    owner = "moe_unpermute"
    if probs is not None:
        if merging_probs is not None:
            raise ValueError(f"{owner}: merging_probs and probs both given; probs is merging_probs' old name")
        warnings.warn(f"{owner}: probs is deprecated; use merging_probs", DeprecationWarning, stacklevel=2)
        merging_probs = probs
    _check_inp(owner, inp)
    _map_type(owner, map_type)
    _tensor(owner, "row_id_map", row_id_map, inp.device)
    if row_id_map.dim() != 2 or row_id_map.dtype != torch.int32:
        raise ValueError(
            f"{owner}: row_id_map: expected moe_permute's (an int32 [num_tokens, slots] tensor), got a "
            f"{row_id_map.dtype} tensor of shape {tuple(row_id_map.shape)}"
        )
    num_tokens, slots = row_id_map.shape
    if restore_shape is not None:
        want = (num_tokens, inp.shape[1])
        if len(restore_shape) != 2 or tuple(int(d) for d in restore_shape) != want:
            raise ValueError(
                f"{owner}: restore_shape: expected {want} (row_id_map's tokens, inp's hidden size), got "
                f"{tuple(restore_shape)}"
            )
    if merging_probs is not None:
        what = "num_experts" if map_type == "mask" else "topK"
        _check_probs(
            owner, "merging_probs", merging_probs, (num_tokens, slots), inp.device, f"[num_tokens, {what}]"
        )
    if pad_offsets is not None:
        row_id_map = _padded_rows(owner, row_id_map, pad_offsets, inp.device, map_type)
    if _host_values(row_id_map) and row_id_map.numel() and int(row_id_map.max()) >= inp.shape[0]:
        raise ValueError(
            f"{owner}: inp: expected the {int(row_id_map.max()) + 1}+ rows moe_permute made "
            f"(num_out_tokens), got {inp.shape[0]}"
        )
    return _Unpermute.apply(inp, row_id_map, merging_probs)


def _index_vector(owner: str, name: str, v) -> torch.Tensor:
    """``v`` as a 1-D integer tensor (a list of ints becomes a CPU int64 one)."""
    if not isinstance(v, torch.Tensor):
        try:
            v = torch.tensor([_int(owner, name, x, "a chunk") for x in v], dtype=torch.long)
        except TypeError:
            raise TypeError(
                f"{owner}: {name}: expected a 1-D integer tensor or a list of ints, got {type(v).__name__}"
            ) from None
    if v.dim() != 1 or v.dtype.is_floating_point or v.dtype.is_complex or v.dtype == torch.bool:
        raise TypeError(
            f"{owner}: {name}: expected a 1-D integer tensor, got a {v.dtype} tensor of shape "
            f"{tuple(v.shape)}"
        )
    return v


def _sort_chunks(owner, inp, probs, split_sizes, sorted_index):
    _check_inp(owner, inp)
    num_tokens = inp.shape[0]
    sizes = _index_vector(owner, "split_sizes", split_sizes)
    order = _index_vector(owner, "sorted_index", sorted_index)
    if sizes.numel() != order.numel():
        raise ValueError(
            f"{owner}: sorted_index: expected one index per chunk ({sizes.numel()}, split_sizes' length), "
            f"got {order.numel()}"
        )
    if sizes.numel() == 0 and num_tokens:
        raise ValueError(
            f"{owner}: split_sizes: expected chunk sizes summing to {num_tokens} (inp's rows), got none"
        )
    if _host_values(sizes) and sizes.numel():
        if int(sizes.min()) < 0 or int(sizes.sum()) != num_tokens:
            raise ValueError(
                f"{owner}: split_sizes: expected sizes >= 0 summing to {num_tokens} (inp's rows), got "
                f"{sizes.tolist()}"
            )
    if _host_values(order) and not torch.equal(order.long().sort().values, torch.arange(order.numel())):
        raise ValueError(
            f"{owner}: sorted_index: expected a permutation of 0..{order.numel() - 1}, got {order.tolist()}"
        )
    if probs is not None:
        _check_probs(owner, "probs", probs, (num_tokens,), inp.device, "one per row of inp")
    sizes = sizes.to(device=inp.device, dtype=torch.long, non_blocking=True)
    order = order.to(device=inp.device, dtype=torch.long, non_blocking=True)
    return _SortChunks.apply(inp, probs, sizes, order, owner)


def moe_sort_chunks_by_index(
    inp: torch.Tensor,
    split_sizes: torch.Tensor,
    sorted_index: torch.Tensor,
) -> torch.Tensor:
    """Splits ``inp``'s rows into chunks of ``split_sizes`` rows and concatenates them in the
    order ``sorted_index`` gives: output chunk i is input chunk ``sorted_index[i]`` (TE's
    ``moe_sort_chunks_by_index``; the all-to-all dispatcher's regrouping by local expert).

    Args:
        inp: ``[num_tokens, hidden_size]`` rows, as for ``moe_permute``.
        split_sizes: 1-D integer tensor (any device; a list of ints also works) of chunk sizes
            >= 0 summing to num_tokens.
        sorted_index: 1-D integer tensor, a permutation of the chunk indices.

    Returns:
        ``[num_tokens, hidden_size]``, the rows reordered.
    """
    out, _ = _sort_chunks("moe_sort_chunks_by_index", inp, None, split_sizes, sorted_index)
    return out


def moe_sort_chunks_by_index_with_probs(
    inp: torch.Tensor,
    probs: torch.Tensor,
    split_sizes: torch.Tensor,
    sorted_index: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``moe_sort_chunks_by_index`` that moves ``probs`` (``[num_tokens]``, one per row) along with
    the rows (TE's ``moe_sort_chunks_by_index_with_probs``). Returns ``(output, permuted_probs)``."""
    owner = "moe_sort_chunks_by_index_with_probs"
    _tensor(owner, "probs", probs)
    return _sort_chunks(owner, inp, probs, split_sizes, sorted_index)
