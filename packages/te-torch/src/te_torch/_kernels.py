"""Direct calls into te_core._C on torch tensors: the one implementation of every te-torch op.

Eager code calls these functions directly (no dispatcher round trip: DESIGN.md "The hot path");
the torch.library ops in _ops.py call the same functions from their CPU/CUDA kernels, so the
traced path and the eager path run the same code. Nothing here validates what the C layer
validates: a bad shape, dtype or device comes back as te's ValueError naming the argument.

Absent parts are None here; the registered ops turn them into empty tensors.
"""

from __future__ import annotations

import math
import threading

import torch
from te_core import _C
from te_core._ops import quantize_outputs

from te_torch._dtypes import TE_DTYPE, te_dtype

_CPU = torch.device("cpu")
_CUDA = int(_C.DeviceType.CUDA)
_PER_TENSOR = int(_C.ScalingMode.PER_TENSOR)
_Tensor = _C.Tensor
_QuantizedTensor = _C.QuantizedTensor
_GemmConfig = _C.GemmConfig
_gemm = _C.gemm
_empty = torch.empty
_GELU_AUX = int(_C.Epilogue.GELU_AUX)
_DGELU = int(_C.Epilogue.DGELU)
_BGRAD = int(_C.Epilogue.BGRAD)
_local = threading.local()  # per-thread caches (gemm configs carry per-call descriptors)

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
    """
    if not x.is_contiguous():
        x = x.contiguous()
    x_te = TE_DTYPE.get(x.dtype)
    if x_te is None:
        x_te = te_dtype(x.dtype, "x")  # raises TypeError naming x
    fp8_te = TE_DTYPE[fp8_dtype]
    shape = x.shape
    if x.is_cuda:
        device = x.device
        dev_type, dev_index = _CUDA, device.index
        stream = _raw_stream(dev_index)
    else:
        device, dev_type, dev_index, stream = _CPU, 0, 0, 0
    if amax is not None and amax_desc is None:
        amax_desc = desc(amax)
    if scale is not None and scale_desc is None:
        scale_desc = desc(scale)
    x_d = _Tensor(x.data_ptr(), x_te, shape, dev_type, dev_index)
    if out is not None:
        rd, rs, cd, cs = out
        q = _QuantizedTensor(mode, desc(rd), desc(rs), desc(cd), desc(cs), amax_desc, scale_desc)
        _C.quantize(x_d, q, config, stream)
        return out
    specs = quantize_outputs(tuple(shape), mode, fp8_te, rowwise, columnwise, False)
    rd = rs = cd = cs = None
    rd_d = rs_d = cd_d = cs_d = None
    if rowwise:
        rd = torch.empty_like(x, dtype=fp8_dtype)  # x is contiguous; cheaper than empty(shape)
        rs = _empty(specs[1].shape, dtype=torch.float32, device=device)
        rd_d = _Tensor(rd.data_ptr(), fp8_te, shape, dev_type, dev_index)
        rs_d = _Tensor(rs.data_ptr(), 0, specs[1].shape, dev_type, dev_index)
    if columnwise:
        cd = _empty(specs[2].shape, dtype=fp8_dtype, device=device)
        cs = _empty(specs[3].shape, dtype=torch.float32, device=device)
        cd_d = _Tensor(cd.data_ptr(), fp8_te, specs[2].shape, dev_type, dev_index)
        cs_d = _Tensor(cs.data_ptr(), 0, specs[3].shape, dev_type, dev_index)
    q = _QuantizedTensor(mode, rd_d, rs_d, cd_d, cs_d, amax_desc, scale_desc)
    _C.quantize(x_d, q, config, stream)
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
    q = _QuantizedTensor(
        mode,
        desc(rowwise_data),
        desc(rowwise_scale_inv),
        desc(columnwise_data),
        desc(columnwise_scale_inv),
    )
    _C.dequantize(q, desc(out), stream_of(out))
    return out


def transpose(data: torch.Tensor) -> torch.Tensor:
    """[..., K] viewed as [M, K] -> a new contiguous [K, M] (any 1-, 2- or 4-byte dtype)."""
    if not data.is_contiguous():
        data = data.contiguous()
    k = data.shape[-1] if data.dim() else 1
    m = data.numel() // k if k else 0
    out = _empty((k, m), dtype=data.dtype, device=data.device)
    _C.transpose(desc(data), desc(out), stream_of(data))
    return out


# (scaling_mode, rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv), None
# where absent: one GEMM operand as te_quantized_tensor sees it. A high-precision operand is
# (PER_TENSOR, data, None, None, None).
Operand = tuple


def gemm_config(
    trans_a: bool, trans_b: bool, accumulate: bool, epilogue: int, has_bias: bool, split: int
) -> _C.GemmConfig:
    """This thread's cached te_gemm_config for one kind of call.

    gemm() writes the per-call epilogue descriptors (bias, aux, bias_grad) into it before each
    call, so the cache is per thread; every other field is fixed by the key. ``has_bias`` is in
    the key because an epilogue that takes an optional bias (GELU_AUX) must see it absent."""
    try:
        cache = _local.gemm_configs
    except AttributeError:
        cache = _local.gemm_configs = {}
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
    if src.is_cuda:
        dev_type, dev_index = _CUDA, src.device.index
        stream = _raw_stream(dev_index)
    else:
        dev_type, dev_index, stream = 0, 0, 0
    if out is None:
        out = _empty(out_shape, dtype=out_dtype, device=src.device)
    d_te = TE_DTYPE.get(out.dtype)
    if d_te is None:
        d_te = te_dtype(out.dtype, "out_dtype")  # raises TypeError
    config = gemm_config(trans_a, trans_b, accumulate, epilogue, bias is not None, split)
    aux = bias_grad = None
    if bias is not None:
        config.bias = desc(bias)
    if epilogue == _GELU_AUX:
        aux = _empty(out_shape, dtype=out.dtype, device=src.device)
        config.aux = _Tensor(aux.data_ptr(), d_te, out_shape, dev_type, dev_index)
    elif epilogue == _DGELU:
        config.aux = desc(gelu_input)
    elif epilogue == _BGRAD:
        bias_grad = _empty((math.prod(out_shape[:-1]),), dtype=out.dtype, device=src.device)
        config.bias_grad = desc(bias_grad)
    mode, rd, rs, cd, cs = a
    a_q = _QuantizedTensor(mode, desc(rd), desc(rs), desc(cd), desc(cs))
    mode, rd, rs, cd, cs = b
    b_q = _QuantizedTensor(mode, desc(rd), desc(rs), desc(cd), desc(cs))
    d_q = _QuantizedTensor(_PER_TENSOR, _Tensor(out.data_ptr(), d_te, out.shape, dev_type, dev_index))
    _gemm(a_q, b_q, d_q, config, stream)
    return out, aux, bias_grad
