"""FSDP2 (``torch.distributed.fsdp.fully_shard``) over te's FP8 weights.

A ``Float8Tensor`` parameter (``te.quantized_model_init`` under DelayedScaling or
Float8CurrentScaling) is sharded by row: each rank keeps its rows' FP8 bytes and the one
``scale_inv`` (1 byte an element, not the 2-4 of a high-precision shard), and FSDP2 all-gathers
the FP8 bytes through these hooks (torch's all-gather extension), so the wire carries a quarter
of an fp32 weight's bytes. The unsharded weight gets its column-wise copy (the dgrad GEMM's
operand) by an exact FP8 transpose after each all-gather.

The shards of one weight must share one scale, or the gathered bytes would mix scales: a shard
re-quantized with ``quantize_`` (the master-weights step) takes the amax of the whole weight, its
shard's amax all-reduced (MAX) over the FSDP group. The group becomes known at the weight's first
all-gather, which also checks once that every rank holds the same scale (a shard quantized on its
own before it: a clear error on every rank, not silently mixed bytes).

A 128x128-tile ``Float8BlockwiseQTensor`` weight (Float8BlockScaling) whose shards are whole
tiles (rows = shard count x a multiple of 128) is sharded the same way, each shard with its tile
rows' scales, which go over the wire beside the bytes. Its tiles are each shard's own, so a shard
re-quantizes alone exactly as the whole weight would.

Block formats whose column-wise copy is its own quantization (blocks along the rows), not a
transpose, send both copies, and after the gather the shards' column-wise pieces [K, rows] are
laid side by side into the weight's [K, M]: 1x128-block weights with such shards (their row-wise
scales, stored transposed, side by side too), ``MXFP8Tensor`` weights whose shards are whole
32-row blocks, and ``NVFP4Tensor`` weights whose shards are whole 16-row blocks. NVFP4 shards
share the whole weight's global amaxes as per-tensor shards share a scale: checked at the first
all-gather, and reduced over the FSDP group when a shard is re-quantized.

Other shard sizes are split to high precision (INFO once, from the split).
"""

from __future__ import annotations

import torch
from te_core import _C
from torch.utils.weak import WeakIdKeyDictionary

from te_torch import _kernels

# the per-tensor part of a sharded weight (a Float8Tensor's scale_inv, an NVFP4Tensor's global
# amaxes; shared by the shard's views) -> its FSDP process group
_GROUPS: WeakIdKeyDictionary = WeakIdKeyDictionary()


def amax_group(key: torch.Tensor) -> object | None:
    """The FSDP group whose ranks hold the other shards of the weight whose per-tensor part
    (scale_inv, or NVFP4's amax) is ``key`` (None: not known)."""
    return _GROUPS.get(key)


def _values(v: torch.Tensor) -> str:
    return ", ".join(f"{x:g}" for x in v.tolist())


def _register(t, key: torch.Tensor, mesh, what: str) -> None:
    """At a shard's first all-gather: checks that every rank holds the same per-tensor ``key``
    (``what`` names it) and records the FSDP group for quantize_'s amax reductions."""
    import torch.distributed as dist

    if key in _GROUPS:
        return
    group = mesh.get_group()
    v = key.float().reshape(-1)
    both = torch.cat([v, -v])  # one MAX all-reduce gives the largest and the smallest
    dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)
    hi, lo = both[: v.numel()], -both[v.numel() :]
    if not torch.equal(hi, lo):
        raise RuntimeError(
            f"FSDP2 all-gather of a te {type(t).__name__} weight {tuple(t.shape)} (this rank's "
            f"shard): the ranks' shards hold different {what} ({_values(lo)} .. {_values(hi)}), "
            f"so the gathered bytes would mix them. Shards of one weight need the same {what}: build "
            "the model identically on every rank (same seed) before fully_shard, and re-quantize "
            "shards only with quantize_ after the first forward (it then reduces the amax "
            "over the FSDP group)"
        )
    _GROUPS[key] = group


def _need_rowwise(t, rowwise_data) -> None:
    if rowwise_data is None:
        raise RuntimeError(
            f"FSDP2 all-gather of a te {type(t).__name__} weight: the shard has no row-wise "
            "copy; restore it with update_usage(rowwise_usage=True)"
        )


def pre_all_gather(t, mesh, outer_size: torch.Size) -> tuple:
    """fsdp_pre_all_gather: the shard's row-wise bytes (uint8, which every backend gathers)."""
    _need_rowwise(t, t._data)
    _register(t, t._scale_inv, mesh, "scales (scale_inv)")
    data = t._data
    rows = -(-outer_size[0] // mesh.size())  # FSDP pads every shard to the first one's rows
    if data.shape[0] != rows:  # a short last shard: a view of FSDP's padded bytes behind it
        data = torch.as_strided(data, (rows, *data.shape[1:]), data.stride(), data.storage_offset())
    return (data.view(torch.uint8),), (t._scale_inv.clone(), t._fp8_dtype, outer_size)


def post_all_gather(t, outputs: tuple, metadata: tuple, param_dtype: torch.dtype, out=None):
    """fsdp_post_all_gather: the unsharded Float8Tensor over the gathered bytes (trimmed of
    FSDP's padding rows), with its column-wise copy; ``out``: refill a previous one in place."""
    from te_torch._float8_tensor import Float8Tensor

    scale_inv, fp8_dtype, outer_size = metadata
    if out is not None:  # its bytes are the re-gathered outputs already
        out._scale_inv.copy_(scale_inv)
        _kernels.transpose(out._data, out._transpose)
        return None
    data = outputs[0][: outer_size[0]].view(fp8_dtype).view(outer_size)
    transpose = _kernels.transpose(data)
    full = Float8Tensor(
        shape=outer_size,
        dtype=param_dtype,
        data=data,
        fp8_scale_inv=scale_inv,
        fp8_dtype=fp8_dtype,
        data_transpose=transpose,
    )
    # FSDP frees and re-allocates these around each reshard; the gathered bytes are its own
    return full, (transpose,)


def _gathered(inputs: list, mesh, metadata: tuple) -> tuple:
    """fsdp_pre_all_gather's return of several inputs. On a one-rank mesh they travel packed
    into one uint8 tensor: FSDP2's one-rank path (torch 2.11-2.13) copies only the first input
    into its unsharded buffers."""
    if mesh.size() > 1:
        return tuple(inputs), (None, *metadata)
    packed = torch.cat([i.reshape(-1).view(torch.uint8) for i in inputs])
    return (packed,), ([(i.shape, i.dtype) for i in inputs], *metadata)


def _outputs(outputs: tuple, metadata: tuple) -> tuple:
    """(the gathered inputs, the hook's metadata): unpacks what _gathered packed."""
    layout, *metadata = metadata
    if layout is None:
        return outputs, metadata
    parts, at = [], 0
    for shape, dtype in layout:
        n = shape.numel() * dtype.itemsize
        parts.append(outputs[0][at : at + n].view(dtype).view(shape))
        at += n
    return tuple(parts), metadata


def block_pre_all_gather(t, mesh, outer_size: torch.Size) -> tuple:
    """fsdp_pre_all_gather of a 128x128-tile shard (whole tiles, equal on every rank): its
    row-wise bytes (uint8) and its tile rows' scales (fp32 [rows / 128, R(ceil(K / 128), 4)])."""
    _need_rowwise(t, t._rowwise_data)
    return _gathered(
        [t._rowwise_data.view(torch.uint8), t._rowwise_scale_inv], mesh, (t._fp8_dtype, outer_size)
    )


def block_post_all_gather(t, outputs: tuple, metadata: tuple, param_dtype: torch.dtype, out=None):
    """fsdp_post_all_gather of a 128x128-tile weight: the shards' rows and tile rows stacked are
    the whole weight's row-wise copy; its column-wise copy is their exact transpose."""
    from te_torch._blockwise_tensor import _PART_CS, Float8BlockwiseQTensor

    outputs, (fp8_dtype, outer_size) = _outputs(outputs, metadata)
    if out is not None:  # its row-wise parts are the re-gathered outputs already
        out._transposed_2d(
            out._rowwise_data,
            out._rowwise_scale_inv,
            _PART_CS,
            out=(out._columnwise_data, out._columnwise_scale_inv.data),  # .data: as _side_by_side
        )
        return None
    data, scale_inv = outputs
    full = Float8BlockwiseQTensor(
        shape=outer_size,
        dtype=param_dtype,
        fp8_dtype=fp8_dtype,
        rowwise_data=data.view(fp8_dtype).view(outer_size),
        rowwise_scale_inv=scale_inv,
        columnwise_data=None,
        columnwise_scale_inv=None,
        is_2D_scaled=True,
    )
    full.update_usage(columnwise_usage=True)
    return full, (full._columnwise_data, full._columnwise_scale_inv)


def block1d_pre_all_gather(t, mesh, outer_size: torch.Size) -> tuple:
    """fsdp_pre_all_gather of a 1x128-block shard (whole 128-row blocks, equal on every rank): each
    copy's bytes (uint8) and scales, the row-wise ones [ceil(K / 128), rows] (stored transposed),
    the column-wise ones [rows / 128, R(K, 4)]: every part is exactly the shard's, no padding."""
    _need_rowwise(t, t._rowwise_data)
    rd, rs, cd, cs = t._parts()
    inputs = [rd.view(torch.uint8), rs]
    if cd is not None:
        inputs += [cd.view(torch.uint8), cs]
    return _gathered(inputs, mesh, (outer_size, t.shape[0]))


def block1d_post_all_gather(t, outputs: tuple, metadata: tuple, param_dtype: torch.dtype, out=None):
    """fsdp_post_all_gather of a 1x128-block weight: the gathered row-wise bytes and column-wise
    scales (block rows) are the weight's; the row-wise scales and the column-wise bytes (their
    columns) are laid side by side into the weight's own."""
    from te_torch._blockwise_tensor import _BLOCK_1D, _PART_RS, Float8BlockwiseQTensor

    outputs, (outer_size, rows) = _outputs(outputs, metadata)
    m, k = outer_size
    full = out
    if full is None:
        rs = outputs[1].new_empty(tuple(_C.quantized_shape(_BLOCK_1D, _PART_RS, outer_size)))
        cd = cs = None
        if len(outputs) > 2:
            cd = torch.empty((k, m), dtype=t._fp8_dtype, device=rs.device)
            cs = outputs[3]
        own = (rs,) if cd is None else (rs, cd)
        full = Float8BlockwiseQTensor(
            shape=outer_size,
            dtype=param_dtype,
            fp8_dtype=t._fp8_dtype,
            rowwise_data=outputs[0].view(t._fp8_dtype).view(outer_size),
            rowwise_scale_inv=rs,
            columnwise_data=cd,
            columnwise_scale_inv=cs,
            is_2D_scaled=False,
        )
    _side_by_side(outputs[1], full._rowwise_scale_inv.shape[0], rows, full._rowwise_scale_inv)
    if len(outputs) > 2:
        _side_by_side(outputs[2], k, rows, full._columnwise_data.view(torch.uint8))
    # FSDP frees and re-allocates these around each reshard; the gathered parts are its own
    return None if out is not None else (full, own)


def mx_pre_all_gather(t, mesh, outer_size: torch.Size) -> tuple:
    """fsdp_pre_all_gather of an MXFP8 / NVFP4 shard (whole blocks of rows, equal on every rank):
    each copy's bytes (uint8) and the valid rows of its block-scale table (padding columns
    kept); an NVFP4 shard's global amaxes travel in the metadata (every rank's are the same)."""
    _need_rowwise(t, t._rowwise_data)
    amax = t._own_amax()
    if amax is not None:
        _register(t, t._amax, mesh, "global amaxes")
    rd, rs, cd, cs = t._parts()
    rows, k = t.shape
    inputs = [rd.view(torch.uint8), rs[:rows]]
    if cd is not None:
        inputs += [cd.view(torch.uint8), cs[:k]]
    return _gathered(inputs, mesh, (outer_size, rows, amax))


def _side_by_side(gathered: torch.Tensor, k: int, cols: int, out: torch.Tensor) -> None:
    """[W x k, c] gathered rank by rank (rank r's [k, c] piece, its first ``cols`` columns
    valid) -> out[:k, :W x cols]: the ranks' pieces side by side."""
    world = gathered.shape[0] // k
    pieces = gathered.view(world, k, -1)[:, :, :cols]
    # through .data: a refill must not bump the version autograd saved the copy at (a te layer's
    # backward reads the weight's column-wise copy FSDP re-gathered, identical, after a reshard)
    out.data[:k, : world * cols].view(k, world, cols).copy_(pieces.transpose(0, 1))


def mx_post_all_gather(t, outputs: tuple, metadata: tuple, param_dtype: torch.dtype, out=None):
    """fsdp_post_all_gather of an MXFP8 / NVFP4 weight: the gathered row-wise bytes are the
    weight's (its scale table too when M is a multiple of 128, else re-padded); the column-wise
    pieces are laid side by side into the weight's own [K, M] copy and its scale table."""
    from te_torch._mx_tensor import _PART_CS, _PART_RS, part_shape

    outputs, (outer_size, rows, amax) = _outputs(outputs, metadata)
    m, k = outer_size
    pack = t._elements_per_byte
    full, own = out, []
    if full is None:
        rs = outputs[1]
        if rs.shape[0] != part_shape(t._mode, _PART_RS, outer_size)[0]:
            rs = rs.new_empty(part_shape(t._mode, _PART_RS, outer_size))
            own.append(rs)
        cd = cs = None
        if len(outputs) > 2:
            cd = t._columnwise_data.new_empty((k, m // pack))
            cs = rs.new_empty(part_shape(t._mode, _PART_CS, outer_size))
            own += [cd, cs]
        rd = outputs[0].view(t._rowwise_data.dtype).view(m, k // pack)
        full = t._like(rd, rs, cd, cs, amax, shape=outer_size, dtype=param_dtype)
    elif amax is not None:
        full._amax.data.copy_(amax)  # .data: as _side_by_side
    if full._rowwise_scale_inv.data_ptr() != outputs[1].data_ptr():
        full._rowwise_scale_inv.data[:m].copy_(outputs[1])
    if len(outputs) > 2:
        _side_by_side(outputs[2], k, rows // pack, full._columnwise_data.view(torch.uint8))
        _side_by_side(outputs[3], k, rows // t._block_size, full._columnwise_scale_inv)
    # FSDP frees and re-allocates these around each reshard; the gathered bytes are its own
    return None if out is not None else (full, tuple(own))


def local_amaxes(quantizer, src: torch.Tensor) -> torch.Tensor:
    """The global amaxes (fp32 [2]: row-wise, column-wise copy) an NVFP4 ``quantizer`` would
    encode ``src`` alone with. A shard of whole 16-row blocks holds whole runs of the Hadamard
    transform, so the whole weight's are the shards' MAX."""
    if quantizer.with_rht and quantizer.columnwise_usage:  # the column-wise amax is after the transform
        return quantizer._run(src)[4]
    return src.detach().abs().amax().float().reshape(1).expand(2).clone()


def reduced_amaxes(quantizer, src: torch.Tensor, group) -> torch.Tensor:
    """The global amaxes of the whole weight: this rank's shard ``src``'s MAX-reduced over
    ``group``."""
    import torch.distributed as dist

    amax = local_amaxes(quantizer, src)
    dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=group)
    return amax


def reduced_amax(src: torch.Tensor, group) -> torch.Tensor:
    """max|src| over every rank of ``group`` (fp32 [1]): the amax of the whole weight."""
    import torch.distributed as dist

    if src.numel():
        amax = src.detach().abs().amax().float().reshape(1)
    else:
        amax = torch.zeros(1, dtype=torch.float32, device=src.device)
    dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=group)
    return amax
