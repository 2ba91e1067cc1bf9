"""Direct calls into te_core._C on torch tensors: the one implementation of every te-torch op.

Eager code calls these functions directly (no dispatcher round trip: DESIGN.md "The hot path");
the torch.library ops in _ops.py call the same functions from their CPU/CUDA kernels, so the
traced path and the eager path run the same code. Nothing here validates what the C layer
validates: a bad shape, dtype or device comes back as te's ValueError naming the argument.

Absent parts are None here; the registered ops turn them into empty tensors.
"""

from __future__ import annotations

import math

import torch
from te_core import _C
from te_core._ops import quantize_outputs

from te_torch._dtypes import TE_DTYPE, te_dtype

_CPU = torch.device("cpu")
_CUDA = int(_C.DeviceType.CUDA)
_PER_TENSOR = int(_C.ScalingMode.PER_TENSOR)
_BLOCK_2D = int(_C.ScalingMode.BLOCK_2D)
_MXFP8 = int(_C.ScalingMode.MXFP8_1D)
_NVFP4 = int(_C.ScalingMode.NVFP4_1D)
_E2M1 = int(_C.DType.FLOAT4_E2M1)
_Tensor = _C.Tensor
_QuantizedTensor = _C.QuantizedTensor
_GemmConfig = _C.GemmConfig
_gemm_flat = _C.gemm_flat
_quantize_flat = _C.quantize_flat
_dequantize_flat = _C.dequantize_flat
_empty = torch.empty
_GELU_AUX = int(_C.Epilogue.GELU_AUX)
_DGELU = int(_C.Epilogue.DGELU)
_BGRAD = int(_C.Epilogue.BGRAD)
_gemm_configs: dict = {}  # gemm_config()'s cache (configs are never mutated once built)
_quantize_shapes: dict = {}  # (source shape, mode) -> output part shapes; see part_shapes()
_packed_sizes: dict = {}  # (mode, fp8 dtype, shape) -> (row bytes, col bytes); see packed()
_U8 = torch.uint8
_TMP_MIN, _TMP_MAX = 1 << 20, 64 << 20  # bytes; see take_tmp()
_tmp_free: dict = {}  # CUDA device index -> its default stream's idle temporary buffer

try:  # the raw cudaStream_t of the current stream, without building a torch.cuda.Stream
    _raw_stream = torch._C._cuda_getCurrentRawStream
except AttributeError:  # CPU-only torch build

    def _raw_stream(index: int) -> int:
        return torch.cuda.current_stream(index).cuda_stream


def desc(t: torch.Tensor | None, dtype: int | None = None) -> _C.Tensor | None:
    """A te_tensor descriptor of a contiguous torch tensor (None stays None). Not owning."""
    if t is None:
        return None
    if dtype is None:
        dtype = TE_DTYPE[t.dtype]
    if t.is_cuda:
        return _Tensor(t.data_ptr(), dtype, t.shape, _CUDA, t.get_device())
    return _Tensor(t.data_ptr(), dtype, t.shape)


def spec(t: torch.Tensor | None) -> tuple | None:
    """A te_tensor as the *_flat entry points take it: (ptr, dtype, shape, device), device -1 for
    the CPU, else the CUDA ordinal; None stays None (absent). Builds no descriptor object."""
    if t is None:
        return None
    return (t.data_ptr(), TE_DTYPE[t.dtype], t.shape, t.get_device())


def part_shapes(shape: torch.Size, mode: int) -> tuple:
    """(rowwise_scale_inv, columnwise_data, columnwise_scale_inv) shapes of quantizing a source of
    ``shape`` (te_quantized_shape, via the op table on a miss), cached per (shape, mode)."""
    key = (shape, mode)
    parts = _quantize_shapes.get(key)
    if parts is None:
        specs = quantize_outputs(tuple(shape), mode, 0, True, True, False)  # raises if invalid
        parts = (specs[1].shape, specs[2].shape, specs[3].shape)
        if len(_quantize_shapes) >= 4096:
            _quantize_shapes.clear()
        _quantize_shapes[key] = parts
    return parts


def packed(mode: int, fp8: int, shape: torch.Size) -> tuple[int, int]:
    """Sizes of the packed row-wise and column-wise copies (rounded up to 256 bytes, so copies
    placed back to back stay aligned; at least 256, so even an empty copy gets its own non-null
    address: a null one means "no copy" to _C.linear_fwd / linear_bwd)."""
    key = (mode, fp8, shape)
    sizes = _packed_sizes.get(key)
    if sizes is None:
        row, col = _C.packed_bytes(mode, fp8, tuple(shape))
        sizes = (max((row + 255) & ~255, 256), max((col + 255) & ~255, 256))
        if len(_packed_sizes) >= 4096:
            _packed_sizes.clear()
        _packed_sizes[key] = sizes
    return sizes


def take_tmp(nbytes: int, device: torch.device, dev: int, stream: int) -> torch.Tensor:
    """At least ``nbytes`` of uint8 device memory for one C call's temporaries (quantized copies
    that the call's own GEMMs read) on ``stream``; hand it to give_tmp once the call returned.

    On a CUDA device's default stream (0) up to 64 MB come from one idle buffer per device instead
    of a torch.empty (3-6 us of host each on the H200 host; a small Linear step needs two). Taking
    it removes it from the cache, so two threads never share it, and it returns only after its
    call has enqueued all its work on that stream: the next call's kernels run after those."""
    if stream == 0 and dev >= 0 and nbytes <= _TMP_MAX:
        buf = _tmp_free.pop(dev, None)
        if buf is not None and buf.numel() >= nbytes:
            return buf
        nbytes = max(nbytes, _TMP_MIN)
    return _empty(nbytes, dtype=_U8, device=device)


def give_tmp(dev: int, stream: int, buf: torch.Tensor) -> None:
    """Ends take_tmp's loan of ``buf`` (its call has returned): on the default stream the larger
    of it and the idle buffer becomes the idle one."""
    if stream == 0 and dev >= 0 and buf.numel() <= _TMP_MAX:
        idle = _tmp_free.get(dev)
        if idle is None or idle.numel() < buf.numel():
            _tmp_free[dev] = buf


def stream_of(t: torch.Tensor) -> int:
    """The current CUDA stream of ``t``'s device as an int (0 for CPU tensors)."""
    return _raw_stream(t.get_device()) if t.is_cuda else 0


def quantize(
    x: torch.Tensor,
    amax: torch.Tensor | None,
    scale: torch.Tensor | None,
    mode: int,
    fp8_dtype: torch.dtype,
    rowwise: bool,
    columnwise: bool,
    config: _C.QuantConfig | None,
    amax_desc: _C.Tensor | None = None,
    scale_desc: _C.Tensor | None = None,
    out: tuple | None = None,
    share_scale_inv: bool = False,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Quantizes ``x`` ([..., K], fp32/bf16/fp16) and returns
    (rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv), None where absent.

    Layouts (te/tensor.h): row-wise data has x's shape; column-wise data is [K, M] with
    M = numel / K; scale_inv shapes per ``mode`` (per-tensor: fp32 [1]; block: transposed, padded
    fp32 block scales whose padding is left unwritten). ``amax``/``scale`` are fp32 [1]
    (per-tensor only): delayed scaling (config.compute_scale false) reads ``scale`` and
    max-accumulates into ``amax``; current scaling writes both. ``amax_desc``/``scale_desc`` are
    cached descriptors of ``amax``/``scale`` (quantizers keep them, saving two per call).
    ``out``: existing (rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv)
    to quantize into in place (None parts are not written); they are returned.
    ``share_scale_inv`` (per-tensor mode, both copies): one fp32 [1] scale_inv serves both copies
    and is returned twice (saves an allocation; not for the registered op, whose outputs must not
    alias).
    """
    if not x.is_contiguous():
        x = x.contiguous()
    x_te = TE_DTYPE.get(x.dtype)
    if x_te is None:
        x_te = te_dtype(x.dtype, "x")  # raises TypeError naming x
    if out is not None:
        if amax is not None and amax_desc is None:
            amax_desc = desc(amax)
        if scale is not None and scale_desc is None:
            scale_desc = desc(scale)
        rd, rs, cd, cs = out
        q = _QuantizedTensor(mode, desc(rd), desc(rs), desc(cd), desc(cs), amax_desc, scale_desc)
        _C.quantize(desc(x, x_te), q, config, stream_of(x))
        return out
    shape = x.shape
    dev = x.get_device()
    if dev >= 0:
        device = x.device
        stream = _raw_stream(dev)
    else:
        device, stream = _CPU, 0
    rs_shape, cd_shape, cs_shape = part_shapes(shape, mode)
    rd = rs = cd = cs = None
    rd_ptr = rs_ptr = cd_ptr = cs_ptr = 0
    if rowwise:
        rd = torch.empty_like(x, dtype=fp8_dtype)  # x is contiguous; cheaper than empty(shape)
        rs = _empty(rs_shape, dtype=torch.float32, device=device)
        rd_ptr, rs_ptr = rd.data_ptr(), rs.data_ptr()
    else:
        rs_shape = None
    if columnwise:
        cd = _empty(cd_shape, dtype=fp8_dtype, device=device)
        if share_scale_inv and rowwise and mode == _PER_TENSOR:
            cs, cs_ptr = rs, rs_ptr
        else:
            cs = _empty(cs_shape, dtype=torch.float32, device=device)
            cs_ptr = cs.data_ptr()
        cd_ptr = cd.data_ptr()
    else:
        cd_shape = cs_shape = None
    _quantize_flat(
        x.data_ptr(), x_te, shape, dev, mode, TE_DTYPE[fp8_dtype],
        rd_ptr, rs_ptr, rs_shape, cd_ptr, cd_shape, cs_ptr, cs_shape,
        amax_desc if amax_desc is not None else spec(amax),
        scale_desc if scale_desc is not None else spec(scale),
        config, stream,
    )  # fmt: skip
    return rd, rs, cd, cs


def dequantize(
    rowwise_data: torch.Tensor | None,
    rowwise_scale_inv: torch.Tensor | None,
    columnwise_data: torch.Tensor | None,
    columnwise_scale_inv: torch.Tensor | None,
    mode: int,
    shape: tuple[int, ...] | torch.Size,
    dtype: torch.dtype,
) -> torch.Tensor:
    """x = q * scale_inv in ``dtype``, of the source's logical ``shape`` [..., K].

    Reads the row-wise copy if given, else the column-wise one ([K, M], transposed back)."""
    src = rowwise_data if rowwise_data is not None else columnwise_data
    out = _empty(shape, dtype=dtype, device=src.device)
    dev = out.get_device()
    _dequantize_flat(
        mode,
        spec(rowwise_data),
        spec(rowwise_scale_inv),
        spec(columnwise_data),
        spec(columnwise_scale_inv),
        (out.data_ptr(), TE_DTYPE[out.dtype], out.shape, dev),
        _raw_stream(dev) if dev >= 0 else 0,
    )
    return out


# -- MXFP8 / NVFP4 (te/tensor.h) -----------------------------------------------------------------
# Storage: MXFP8 data is torch float8 (e4m3fn / e5m2); NVFP4 data is uint8 holding two E2M1
# elements per byte (te's packing: first element in the low nibble), so a copy of logical shape
# [..., C] is stored [..., C / 2]. Scale tables are uint8 bytes (E8M0 for MXFP8, E4M3 for NVFP4),
# as TE stores them: torch >= 2.4 (te_torch's floor) has no float8_e8m0fnu everywhere. te's
# descriptors take the logical shape and the te dtype, so these parts go to te-core through
# mx_specs(), never spec().

_MX_SCALE_TE = {_MXFP8: int(_C.DType.FLOAT8_E8M0), _NVFP4: int(_C.DType.FLOAT8_E4M3)}


def e2m1_spec(t: torch.Tensor | None) -> tuple | None:
    """The te_tensor spec of packed E2M1 bytes [..., C / 2]: dtype FLOAT4_E2M1, shape [..., C]."""
    if t is None:
        return None
    return (t.data_ptr(), _E2M1, (*t.shape[:-1], t.shape[-1] * 2), t.get_device())


def quantize_mx(
    x: torch.Tensor,
    mode: int,
    data_dtype: torch.dtype | None,
    rowwise: bool,
    columnwise: bool,
    config: _C.QuantConfig,
    columnwise_rht: bool = False,
    amax: torch.Tensor | None = None,
) -> tuple:
    """te_quantize of ``x`` ([..., K], fp32/bf16/fp16) into MXFP8_1D or NVFP4_1D ``mode``.

    Returns (rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv, amax), None
    where absent: row-wise data [..., K], column-wise [K, M] (M = numel / K), each with its
    block-scale table (te/tensor.h: [roundup(rows, 128), roundup(ceil(cols / block), 4)], the
    padding never written); NVFP4 data packed as above and ``amax`` its fp32 [2] global amaxes
    (row-wise, column-wise copy); MXFP8 has no amax (None). ``data_dtype``: the MXFP8 element
    dtype (ignored for NVFP4). ``config`` carries 2-D tiles and stochastic rounding;
    ``columnwise_rht`` (NVFP4): the column-wise copy holds the Hadamard-transformed source.
    ``amax`` (NVFP4, with ``config.use_existing_amax``): the fp32 [2] global amaxes to encode
    with (e.g. reduced over the ranks holding the other shards), returned as given.
    """
    if not x.is_contiguous():
        x = x.contiguous()
    x_te = TE_DTYPE.get(x.dtype)
    if x_te is None:
        x_te = te_dtype(x.dtype, "x")  # raises TypeError naming x
    shape = x.shape
    dev = x.get_device()
    device = x.device
    nvfp4 = mode == _NVFP4
    rs_shape, cd_shape, cs_shape = part_shapes(shape, mode)
    rd = rs = cd = cs = None
    rd_ptr = rs_ptr = cd_ptr = cs_ptr = 0
    if rowwise:
        if nvfp4:  # te validates K even before writing (a shorter buffer is never written)
            rd = _empty((*shape[:-1], shape[-1] // 2), dtype=torch.uint8, device=device)
        else:
            rd = torch.empty_like(x, dtype=data_dtype)
        rs = _empty(rs_shape, dtype=torch.uint8, device=device)
        rd_ptr, rs_ptr = rd.data_ptr(), rs.data_ptr()
    else:
        rs_shape = None
    if columnwise:
        stored = (cd_shape[0], cd_shape[1] // 2) if nvfp4 else cd_shape
        cd = _empty(stored, dtype=torch.uint8 if nvfp4 else data_dtype, device=device)
        cs = _empty(cs_shape, dtype=torch.uint8, device=device)
        cd_ptr, cs_ptr = cd.data_ptr(), cs.data_ptr()
    else:
        cd_shape = cs_shape = None
    if nvfp4 and amax is None:
        amax = _empty((2,), dtype=torch.float32, device=device)
    _quantize_flat(
        x.data_ptr(), x_te, shape, dev, mode, _E2M1 if nvfp4 else TE_DTYPE[data_dtype],
        rd_ptr, rs_ptr, rs_shape, cd_ptr, cd_shape, cs_ptr, cs_shape, spec(amax), None, config,
        _raw_stream(dev) if dev >= 0 else 0, columnwise_rht,
    )  # fmt: skip
    return rd, rs, cd, cs, amax


def mx_specs(op: tuple) -> tuple:
    """The te_tensor specs of an MXFP8 / NVFP4 operand tuple's parts (Operand, below):
    (rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv, amax, rht)."""
    mode, rd, rs, cd, cs = op[:5]
    amax, rht = (op[5], op[6]) if len(op) > 5 else (None, False)
    data = e2m1_spec if mode == _NVFP4 else spec
    s_te = _MX_SCALE_TE.get(mode)  # None: another mode (te_gemm's error names the mix)

    def scales(t):
        if t is None or s_te is None:
            return spec(t)
        return (t.data_ptr(), s_te, t.shape, t.get_device())

    return data(rd), scales(rs), data(cd), scales(cs), spec(amax), rht


def dequantize_mx(op: tuple, shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """te_dequantize of an MXFP8 / NVFP4 operand tuple into a new ``dtype`` tensor of the
    source's ``shape`` [..., K]: reads the row-wise copy if present, else the column-wise one
    (transposed back, and for NVFP4 with the Hadamard transform undone)."""
    rd, rs, cd, cs, amax, rht = mx_specs(op)
    src = op[1] if op[1] is not None else op[3]
    out = _empty(shape, dtype=dtype, device=src.device)
    dev = out.get_device()
    _dequantize_flat(
        op[0], rd, rs, cd, cs, (out.data_ptr(), TE_DTYPE[out.dtype], out.shape, dev),
        _raw_stream(dev) if dev >= 0 else 0, amax, rht,
    )  # fmt: skip
    return out


def transpose(data: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """[..., K] viewed as [M, K] -> a contiguous [K, M] (any 1-, 2- or 4-byte dtype), new or
    written into ``out`` (contiguous [K, M] of data's dtype, which the C call checks)."""
    if not data.is_contiguous():
        data = data.contiguous()
    k = data.shape[-1] if data.dim() else 1
    m = data.numel() // k if k else 0
    if out is None:
        out = _empty((k, m), dtype=data.dtype, device=data.device)
    _C.transpose(desc(data), desc(out), stream_of(data))
    return out


# (scaling_mode, rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv), None
# where absent: one GEMM operand as te_quantized_tensor sees it. A high-precision operand is
# (PER_TENSOR, data, None, None, None). An NVFP4 operand has two more entries, (..., amax, rht):
# its fp32 [2] global amaxes and whether its column-wise copy carries the Hadamard transform.
Operand = tuple


def gemm_config(
    trans_a: bool, trans_b: bool, accumulate: bool, epilogue: int, has_bias: bool, split: int
) -> _C.GemmConfig:
    """The cached te_gemm_config for one kind of call (never mutated: gemm() passes the per-call
    epilogue tensors bias, aux, bias_grad to _C.gemm_flat beside it, which uses only the config's
    scalar fields). ``has_bias`` stays in the key for callers that set the config's bias."""
    cache = _gemm_configs
    key = (trans_a, trans_b, accumulate, epilogue, has_bias, split)
    config = cache.get(key)
    if config is None:
        config = _GemmConfig(
            trans_a, trans_b, 1.0, 1.0 if accumulate else 0.0, epilogue, use_split_accumulator=split
        )
        cache[key] = config
    return config


def gemm(
    a: Operand,
    b: Operand,
    trans_a: bool,
    trans_b: bool,
    out: torch.Tensor | None,
    out_shape: tuple[int, ...],
    out_dtype: torch.dtype,
    accumulate: bool,
    epilogue: int,
    bias: torch.Tensor | None,
    gelu_input: torch.Tensor | None,
    split: int,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """te_gemm (te/gemm.h): D = op(A) op(B) (+ D with ``accumulate``), then ``epilogue``.

    Returns (D, aux, bias_grad): D is ``out`` if given, else a new ``out_dtype`` tensor of
    ``out_shape`` (any shape whose matrix view is [M, N]); aux (GELU_AUX: the pre-activation, of
    ``out_shape``) and bias_grad (BGRAD: [M], ``out_dtype``) are None for other epilogues.
    ``bias``: [N] for BIAS / GELU_AUX; ``gelu_input``: the saved pre-activation DGELU reads.
    ``split``: use_split_accumulator, -1 for te's default. Tensors must be contiguous.
    """
    src = a[1] if a[1] is not None else a[3]
    dev = src.get_device()
    stream = _raw_stream(dev) if dev >= 0 else 0
    if out is None:
        out = _empty(out_shape, dtype=out_dtype, device=src.device)
    d_te = TE_DTYPE.get(out.dtype)
    if d_te is None:
        d_te = te_dtype(out.dtype, "out_dtype")  # raises TypeError
    config = gemm_config(trans_a, trans_b, accumulate, epilogue, bias is not None, split)
    aux = bias_grad = aux_s = bias_grad_s = None
    if epilogue == _GELU_AUX:
        aux = _empty(out_shape, dtype=out.dtype, device=src.device)
        aux_s = (aux.data_ptr(), d_te, out_shape, dev)
    elif epilogue == _DGELU:
        aux_s = spec(gelu_input)
    elif epilogue == _BGRAD:
        bias_grad = _empty((math.prod(out_shape[:-1]),), dtype=out.dtype, device=src.device)
        bias_grad_s = spec(bias_grad)
    if a[0] > _BLOCK_2D or b[0] > _BLOCK_2D:  # MXFP8 / NVFP4: byte scales, packed E2M1, amaxes
        a_rd, a_rs, a_cd, a_cs, a_amax, a_rht = mx_specs(a)
        b_rd, b_rs, b_cd, b_cs, b_amax, b_rht = mx_specs(b)
        _gemm_flat(
            a[0], a_rd, a_rs, a_cd, a_cs, b[0], b_rd, b_rs, b_cd, b_cs,
            (out.data_ptr(), d_te, out.shape, out.get_device()), config, spec(bias), aux_s,
            bias_grad_s, stream, a_amax, b_amax, a_rht, b_rht,
        )  # fmt: skip
        return out, aux, bias_grad
    # The operands' parts as (ptr, dtype, shape, device) tuples, inline: no call per part.
    T = TE_DTYPE
    a_mode, ard, ars, acd, acs = a
    b_mode, brd, brs, bcd, bcs = b
    _gemm_flat(
        a_mode,
        None if ard is None else (ard.data_ptr(), T[ard.dtype], ard.shape, ard.get_device()),
        None if ars is None else (ars.data_ptr(), T[ars.dtype], ars.shape, ars.get_device()),
        None if acd is None else (acd.data_ptr(), T[acd.dtype], acd.shape, acd.get_device()),
        None if acs is None else (acs.data_ptr(), T[acs.dtype], acs.shape, acs.get_device()),
        b_mode,
        None if brd is None else (brd.data_ptr(), T[brd.dtype], brd.shape, brd.get_device()),
        None if brs is None else (brs.data_ptr(), T[brs.dtype], brs.shape, brs.get_device()),
        None if bcd is None else (bcd.data_ptr(), T[bcd.dtype], bcd.shape, bcd.get_device()),
        None if bcs is None else (bcs.data_ptr(), T[bcs.dtype], bcs.shape, bcs.get_device()),
        (out.data_ptr(), d_te, out.shape, out.get_device()),
        config,
        None if bias is None else (bias.data_ptr(), T[bias.dtype], bias.shape, bias.get_device()),
        aux_s,
        bias_grad_s,
        stream,
    )
    return out, aux, bias_grad


def gemm_fp8_output(
    a: Operand,
    b: Operand,
    trans_a: bool,
    trans_b: bool,
    out_shape: tuple[int, ...],
    fp8_dtype: torch.dtype,
    epilogue: int,
    bias: torch.Tensor | None,
    split: int,
    scale: torch.Tensor,
    amax: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """te_gemm with a per-tensor FP8 output (te/gemm.h): D = fp8((op(A) op(B) (+ bias)) * scale),
    saturating, the product and bias in fp32 and rounded once, to FP8.

    Returns (D, scale_inv): D a new ``fp8_dtype`` tensor of ``out_shape``, scale_inv a new fp32 [1]
    holding 1/scale (written by te_gemm). ``scale`` (fp32 [1]) is read; ``amax`` (fp32 [1]) is
    updated to max(amax, max |result|) before the cast (NaN propagates). ``bias``: [N], bfloat16 or
    float32 (te_gemm's rule for an FP8 output). ``epilogue``: DEFAULT or BIAS. Tensors must be
    contiguous; ``split`` as in gemm()."""
    src = a[1] if a[1] is not None else a[3]
    dev = src.get_device()
    out = _empty(out_shape, dtype=fp8_dtype, device=src.device)
    scale_inv = _empty((1,), dtype=torch.float32, device=src.device)
    config = gemm_config(trans_a, trans_b, False, epilogue, bias is not None, split)
    _gemm_flat(
        a[0], spec(a[1]), spec(a[2]), spec(a[3]), spec(a[4]),
        b[0], spec(b[1]), spec(b[2]), spec(b[3]), spec(b[4]),
        spec(out), config, spec(bias), None, None, _raw_stream(dev) if dev >= 0 else 0,
        d_scale=spec(scale), d_amax=spec(amax), d_scale_inv=spec(scale_inv),
    )  # fmt: skip
    return out, scale_inv
