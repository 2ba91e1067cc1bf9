"""te.Linear's eager FP8 step as two calls into te_core._C (csrc/python/linear_step.cpp).

LinearFn's traced path (torch.compile) runs quantize / GEMM ops one by one; eagerly the same
work is one ``_C.linear_fwd`` and one ``_C.linear_bwd`` call, with every quantized copy packed
into one byte buffer per lifetime:

    forward   tmp   = [x row-wise | W row-wise]        dead once fprop has run
              saved = [x column-wise | W column-wise]  kept for wgrad / dgrad (only what they read)
    backward  tmp   = [dy row-wise | dy column-wise]

so a step allocates 3 + 4 tensors instead of ~13 and crosses into C++ twice instead of ~6 times;
on the H200 host the Python frames, allocations and argument conversions of the unfused path cost
more than its kernels at small sizes (benchmarks/NOTES.md). The numerics are the unfused path's:
the same te_quantize / te_dbias_quantize / te_gemm calls with the same arguments.

A per-tensor step whose weight needs a gradient and whose token count M is not a multiple of 16
pads here, not in the module (_token_pad): x is quantized as [M_pad, K] (the last row copied)
and dy as [M_pad, N] (zero rows), the wgrad GEMM reduces over M_pad, and fprop and dgrad read
the first M rows of the row-wise copies (te_core's rowwise_for), so y and dx come out with M rows
and no slice or copy of them is made, nor an autograd node for either (the module-level padding
cost a small step 2.1x its time on the H200 host, and a 4096 -> 4096 step 15%).
"""

from __future__ import annotations

import torch
from te_core import _C

from te_torch._dtypes import TE_DTYPE
from te_torch._fp8_io import grad_operand
from te_torch._high_precision import main_grad_of
from te_torch._kernels import _raw_stream, gemm_config, give_tmp, packed, spec, take_tmp
from te_torch._quantized_tensor import PLAIN_TYPES, QuantizedTensor
from te_torch._token_pad import pad_rows, padded_source, step_pad

_U8 = torch.uint8
_empty = torch.empty
_linear_fwd = _C.linear_fwd
_linear_bwd = _C.linear_bwd
_DEFAULT, _BIAS = int(_C.Epilogue.DEFAULT), int(_C.Epilogue.BIAS)


def _stored_operand(op: tuple) -> tuple:
    """A stored quantized weight's (mode, rd, rs, cd, cs) as a kind-2 operand."""
    return (2, op[0], spec(op[1]), spec(op[2]), spec(op[3]), spec(op[4]))


def weight_plan(c, weight: torch.Tensor, first, need_col: bool, dev: int) -> tuple:
    """How a step gets its quantized weight: (wq, row bytes, col bytes, keep). A fresh weight is
    quantized by ``wq`` (its quantizer's _flat()) into packed copies of those sizes (col 0: no
    column-wise copy); a stored quantized weight or is_first_microbatch's cached copy is read as
    it is (``keep``: its parts, alive until backward even if re-cached; wq None).

    ``dev``: the input's device index (-1: CPU). The step describes the weight and the buffers
    its copies go to by that index, so a weight elsewhere is refused here: te-core's own device
    checks would see only the index it was given, and a CUDA pointer read by the CPU backend
    crashes the process. A step plan holds a fresh weight's plan, made once per kind of call,
    whose key has both devices."""
    if weight.get_device() != dev:
        raise ValueError(
            f"{c.owner}: the input is on {'cpu' if dev < 0 else f'cuda:{dev}'} but a weight is on "
            f"{weight.device}: move the input, or the module (module.to(...)), to one device"
        )
    if first is None and not isinstance(weight, QuantizedTensor):
        wq = c.w_q[3]._flat()
        wr, wc = packed(wq[0], wq[1], weight.shape)
        return wq, wr, wc if need_col else 0, None
    return None, 0, 0, c.weight_operand(weight, first, need_col)


def weight_operands(weight: torch.Tensor, plan: tuple, dev: int, row: int, col: int) -> tuple:
    """(forward operand, backward operand) of weight_plan's weight, fresh copies at row / col."""
    wq, _, wc, keep = plan
    if wq is None:
        op = _stored_operand(keep)
        return op, op
    col = col if wc else 0
    w_spec = (weight.data_ptr(), TE_DTYPE[weight.dtype], weight.shape, dev)
    return (0, w_spec, wq, row, col), (1, wq[0], wq[1], weight.shape, dev, 0, col)


def bwd_weight(w_bwd: tuple | None, keep) -> tuple | None:
    """The backward's weight operand. A stored quantized or cached weight's pointers are read
    again here, not kept from forward: FSDP2 frees a gathered weight's bytes after forward and
    gathers them again, at other addresses, before backward."""
    if w_bwd is None or w_bwd[0] != 2:
        return w_bwd
    return _stored_operand(keep)


def gemm_bias(bias, dtype: torch.dtype):
    """The bias as a quantized GEMM's epilogue adds it: in the output's dtype (TE's rule),
    contiguous. cuBLASLt has no fused FP8 kernel for an fp32 bias beside a 16-bit output, so an
    fp32 bias sent as it is took te-core's fallback (the fp32 product, then a separate bias
    pass): 4.8 ms of a 30 ms FP8 step of the demo's GPT on the H200, whose fp32 parameters under
    torch.autocast are the usual mixed-precision setup. The bias gradient keeps the parameter's
    dtype."""
    if bias is not None:
        if bias.dtype != dtype:
            return bias.to(dtype)
        if not bias.is_contiguous():
            return bias.contiguous()
    return bias


def fprop_config(c, bias) -> _C.GemmConfig:
    return gemm_config(False, True, False, _DEFAULT if bias is None else _BIAS, False, _split(c.split[0]))


def column_sums(dy: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The bias gradient when dy is not quantized here (no other gradient needed, or dy came
    quantized)."""
    return dy.reshape(-1, dy.shape[-1]).float().sum(0).to(dtype)


def _split(flag) -> int:
    return -1 if flag is None else int(bool(flag))


def padded_grad(dy: torch.Tensor, count: int) -> torch.Tensor:
    """dy of a step padded by ``count`` rows: zero rows appended (a quantized dy as its values:
    the saved copies are padded, so dy's must be too)."""
    if type(dy) is not torch.Tensor and isinstance(dy, QuantizedTensor):
        dy = dy.dequantize()
    return pad_rows(dy, count, True)


# Whether the running backward pass keeps its graph (retain_graph); True outside a backward.
_keep_graph = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", lambda: True)
_RELEASED = object()  # ctx.saved_buf of a step whose backward has run without retain_graph


def release_saved(ctx) -> None:
    """Drops a fused step's saved copies once its backward has run, unless the pass keeps the
    graph. They live in ctx attributes, not in save_for_backward (raw pointers into them travel
    in the operand tuples), so autograd does not free them after the pass as it frees saved
    tensors: without this they lived until the graph was dropped, which in a training loop
    (``loss = model(x); loss.backward()``) is after the next step's forward has run, so that
    forward's peak held every layer's saved FP8 copies (and LayerNormMLP's FC1 output) twice."""
    if not _keep_graph():
        ctx.saved_buf = _RELEASED
        ctx.keep = None


def check_not_released(ctx, owner: str) -> None:
    """A second backward through a step whose copies release_saved dropped: torch's error for
    its own saved tensors (the copies' addresses in ctx would point at freed memory)."""
    if ctx.saved_buf is _RELEASED:
        raise RuntimeError(
            f"{owner}: trying to backward through the graph a second time; its saved quantized "
            "copies were freed by the first backward. Specify retain_graph=True in the first "
            "backward (or autograd.grad) to backward through the graph again."
        )


class StepPlan:
    """What te.Linear's eager steps of one kind (input shape and dtype, weight, which gradients,
    bias or not) reuse from call to call: the quantizations' flat tuples, the packed copies'
    sizes, a fresh weight's weight_plan (``w``), the output shape and the GEMM configs, so a
    call only allocates, reads data pointers
    and enters te_core._C. On the H200 host every line of Python before the C call delays the
    step's first kernel by a few microseconds (benchmarks/NOTES.md); deriving these per call cost
    a small step ~12% of te's Python (dev machine, C calls stubbed). Kept per FP8Context
    (``c.plans``), whose quantizers' buffers live as long as it does; ``bwd`` is the backward's
    part for the last gradient kind seen (``bwd_key``)."""

    __slots__ = (
        "device", "x_shape", "xq", "xr", "xc", "pad", "src_shape", "w", "w_shape", "out_shape",
        "out_dt", "fprop", "bwd_key", "bwd",
    )  # fmt: skip


def step_plan(
    c,
    inp: torch.Tensor,
    weight: torch.Tensor,
    need_dx: bool,
    need_dw: bool,
    fresh: bool,
    bias: torch.Tensor | None,
    cls: type = StepPlan,
) -> StepPlan:
    """A new StepPlan (``cls``: a subclass with more to fill in) for ``c`` (remember() keeps it).
    ``fresh``: the weight is quantized by the step (not stored quantized, no is_first_microbatch
    cache); ``need_dx``: its dgrad needs the weight's column-wise copy."""
    plan = cls()
    plan.device = inp.device
    plan.xq = xq = c.x_q[3]._flat()
    plan.pad = pad = step_pad(inp, c.per_tensor, need_dw)
    plan.src_shape = torch.Size((inp.numel() // inp.shape[-1] + pad, inp.shape[-1])) if pad else inp.shape
    xr, xc = packed(xq[0], xq[1], plan.src_shape)
    plan.xr, plan.xc = xr, xc if need_dw else 0
    plan.w = weight_plan(c, weight, None, need_dx, inp.get_device()) if fresh else None
    plan.w_shape = weight.shape
    plan.x_shape = inp.shape
    plan.out_shape = torch.Size((*inp.shape[:-1], weight.shape[0]))
    plan.out_dt = TE_DTYPE[inp.dtype]
    plan.fprop = fprop_config(c, bias)
    plan.bwd_key = plan.bwd = None
    return plan


def remember(c, key: tuple, plan):
    """Keeps a complete ``plan`` as ``c.plans[key]`` and returns it (only then: modules that
    torch.nn.DataParallel replicates share their contexts across threads)."""
    if len(c.plans) >= _MAX_PLANS:  # shapes that keep changing (inference over many lengths)
        c.plans.clear()
    c.plans[key] = plan
    return plan


_MAX_PLANS = 64  # per FP8Context


def quantized_here(first, *weights: torch.Tensor) -> bool:
    """Whether the step quantizes its weights itself (a fresh copy each call): no
    is_first_microbatch cache in play and none stored quantized (te.quantized_model_init).
    type() first: isinstance against the Tensor subclass costs ~0.3 us through torch's metaclass."""
    if first is not None:
        return False
    return all(type(w) in PLAIN_TYPES or not isinstance(w, QuantizedTensor) for w in weights)


def forward(
    ctx, inp: torch.Tensor, weight: torch.Tensor, bias, c, first, fuse_wgrad: bool, need=None, out=None
):
    """LinearFn.forward, eagerly (see the module docstring). With ``ctx`` None it is the module's
    whole forward under torch.no_grad(), called without an autograd Function: it keeps nothing
    for a backward (on the H200 host Function.apply, the detaches and the ctx fields it needs
    cost a 15-token inference forward about a third of its host time).

    A caller stepping several GEMMs in one Function (te.GroupedLinear) gives ``need`` (need_dx,
    need_dw; else read from the tensors' requires_grad) and ``out``, the contiguous rows of its
    output this GEMM writes (else a new tensor)."""
    if need is not None:
        need_dx, need_dw = need
    else:
        need_dx, need_dw = (inp.requires_grad, weight.requires_grad) if ctx is not None else (False, False)
    if not inp.is_contiguous():
        inp = inp.contiguous()
    dev = inp.get_device()
    fresh = quantized_here(first, weight)
    # inp.device, not dev: a meta tensor's index is -1 as the CPU's (its plan allocates on meta)
    key = (inp.shape, inp.dtype, inp.device, weight.shape, weight.dtype, weight.get_device(), need_dx,
           need_dw, fresh, bias is None)  # fmt: skip
    plan = c.plans.get(key) or remember(c, key, step_plan(c, inp, weight, need_dx, need_dw, fresh, bias))
    stream = _raw_stream(dev) if dev >= 0 else 0
    device = plan.device
    src = padded_source(inp, plan.pad) if plan.pad else inp
    xr, xc = plan.xr, plan.xc
    w_plan = plan.w if fresh else weight_plan(c, weight, first, need_dx, dev)
    _, wr, wc, keep = w_plan
    tmp = take_tmp(xr + wr, device, dev, stream)
    tp = tmp.data_ptr()
    saved = None
    sp = 0
    if xc + wc:
        saved = _empty(xc + wc, dtype=_U8, device=device)
        sp = saved.data_ptr()
    x_fwd = (0, (src.data_ptr(), TE_DTYPE[src.dtype], plan.src_shape, dev), plan.xq, tp, sp if xc else 0)
    w_fwd, w_bwd = weight_operands(weight, w_plan, dev, tp + xr, sp + xc)
    b_dtype = None if bias is None else bias.dtype
    bias = gemm_bias(bias, inp.dtype)
    if out is None:
        out = _empty(plan.out_shape, dtype=inp.dtype, device=device)
    _linear_fwd(
        x_fwd, w_fwd, spec(bias), (out.data_ptr(), plan.out_dt, plan.out_shape, dev), plan.fprop, stream
    )  # fmt: skip
    give_tmp(dev, stream, tmp)
    if ctx is None:
        return out
    ctx.packed = True
    ctx.plan, ctx.c, ctx.fuse = plan, c, fuse_wgrad
    ctx.saved_buf, ctx.keep, ctx.sp = saved, keep, sp
    ctx.w_bwd = w_bwd if need_dx else None
    ctx.x_dtype = inp.dtype
    ctx.weight = weight if fuse_wgrad else None
    ctx.w_dtype, ctx.b_dtype = weight.dtype, b_dtype
    return out


def given_grad(dy, c, need_row: bool, need_col: bool, b_dtype) -> tuple:
    """(dy, g, db, parts): a quantized ``dy`` (the next layer's ``fp8_grad``) is the GEMMs'
    operand as it is (g, kind 2: addresses only, so the caller keeps ``parts`` alive until the
    call, a copy made for it among them), its bias gradient (``b_dtype`` not None) the column
    sums of its dequantized values (as in _linear_fn._backward); in another recipe's format (or
    when no GEMM reads it) it is dequantized, and a plain ``dy`` stays as it is (g None)."""
    if type(dy) is torch.Tensor or not isinstance(dy, QuantizedTensor):
        return dy, None, None, None
    gq = grad_operand(dy, c, need_row, need_col) if need_row or need_col else None
    if gq is None:
        return dy.dequantize(), None, None, None
    db = None if b_dtype is None else column_sums(dy.dequantize(torch.float32), b_dtype)
    return dy, _stored_operand(gq), db, gq


def wgrad_target(c, fuse: bool, weight, shape, dtype: torch.dtype, dev: int, device) -> tuple:
    """(dw, dw spec, wgrad config): a new weight gradient, or with ``fuse`` (dw None) the GEMM
    accumulating into ``weight.main_grad`` (overwriting with ``weight.overwrite_main_grad``)."""
    tail = (_DEFAULT, False, _split(c.split[2]))
    if not fuse:
        dw = _empty(shape, dtype=dtype, device=device)
        return dw, (dw.data_ptr(), TE_DTYPE[dtype], shape, dev), gemm_config(True, False, False, *tail)
    main_grad = main_grad_of(weight, quantized=True)
    accumulate = not getattr(weight, "overwrite_main_grad", False)
    dw_spec = (main_grad.data_ptr(), TE_DTYPE[torch.float32], main_grad.shape, main_grad.get_device())
    return None, dw_spec, gemm_config(True, False, accumulate, *tail)


def mark_main_grad(weight) -> None:
    """Megatron's flag that the weight gradient went into main_grad (when the weight has it)."""
    if hasattr(weight, "grad_added_to_main_grad"):
        weight.grad_added_to_main_grad = True


def dgrad_config(c) -> _C.GemmConfig:
    return gemm_config(False, False, False, _DEFAULT, False, _split(c.split[1]))


class GradPlan:
    """StepPlan's backward part for one kind of output gradient (shape, dtype, which gradients):
    dy's quantization and packed sizes, the dgrad config."""

    __slots__ = ("gq", "gr", "gc", "dgrad", "dy_dt")


def grad_plan(c, dy: torch.Tensor, need_row: bool, need_col: bool) -> GradPlan:
    """A GradPlan of GEMM context ``c`` for ``dy``'s kind (its row-wise copy for dgrad, its
    column-wise copy for wgrad, where asked)."""
    gp = GradPlan()
    gp.gq = gq = c.g_q[3]._flat()
    gr, gc = packed(gq[0], gq[1], dy.shape)
    gp.gr, gp.gc = (gr if need_row else 0), (gc if need_col else 0)
    gp.dgrad = dgrad_config(c)
    gp.dy_dt = TE_DTYPE[dy.dtype]
    return gp


def backward(ctx, dy: torch.Tensor, dx=None) -> tuple:
    """LinearFn.backward, eagerly: (dx, dw, db, None, None, None); a quantized ``dy`` as in
    given_grad. ``dx``: the contiguous rows of a larger input gradient this GEMM writes (else a
    new tensor)."""
    c, plan = ctx.c, ctx.plan
    check_not_released(ctx, c.owner)
    need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
    if plan.pad:
        dy = padded_grad(dy, plan.pad)
    g = parts = db = None
    if type(dy) is not torch.Tensor:
        dy, g, db, parts = given_grad(dy, c, need_dx, need_dw, ctx.b_dtype if need_db else None)
    if not (need_dx or need_dw):
        return None, None, column_sums(dy, ctx.b_dtype) if need_db else None, None, None, None
    if g is None and not dy.is_contiguous():
        dy = dy.contiguous()
    dev = dy.get_device()
    device = plan.device
    stream = _raw_stream(dev) if dev >= 0 else 0
    c.register_backward()
    key = (dy.shape, dy.dtype, need_dx, need_dw)
    gp = plan.bwd
    if plan.bwd_key != key:
        gp = plan.bwd = grad_plan(c, dy, need_dx, need_dw)
        plan.bwd_key = key
    tmp = None
    if g is None:
        gr, gc = gp.gr, gp.gc
        tmp = take_tmp(gr + gc, device, dev, stream)
        tp = tmp.data_ptr()
        g = (0, (dy.data_ptr(), gp.dy_dt, dy.shape, dev), gp.gq, tp if gr else 0, tp + gr if gc else 0)
    else:
        need_db = False  # summed by given_grad
    if need_db:
        db = _empty(plan.out_shape[-1:], dtype=ctx.b_dtype, device=device)
    dx_spec = None
    if not need_dx:
        dx = None
    else:
        if dx is None:
            dx = _empty(plan.x_shape, dtype=dy.dtype, device=device)
        dx_spec = (dx.data_ptr(), gp.dy_dt, plan.x_shape, dev)
    dw = dw_spec = wgrad = x_bwd = None
    if need_dw:
        xq = plan.xq
        x_bwd = (1, xq[0], xq[1], plan.src_shape, dev, 0, ctx.sp)
        dw, dw_spec, wgrad = wgrad_target(c, ctx.fuse, ctx.weight, plan.w_shape, ctx.w_dtype, dev, device)
    _linear_bwd(
        g, spec(db) if need_db else None, x_bwd, bwd_weight(ctx.w_bwd, ctx.keep), dx_spec,
        gp.dgrad if need_dx else None, dw_spec, wgrad, stream,
    )  # fmt: skip
    if tmp is not None:
        give_tmp(dev, stream, tmp)
    del parts  # alive until here
    release_saved(ctx)
    if need_dw and ctx.fuse:
        mark_main_grad(ctx.weight)
    return dx, dw, db, None, None, None
