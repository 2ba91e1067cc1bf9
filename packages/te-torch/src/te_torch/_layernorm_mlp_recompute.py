"""``te.LayerNormMLP(checkpoint=True)``: selective recompute (TE's flag of that name).

FC1's output h [tokens, (2 *) ffn] and the activation's output a [tokens, ffn] are the layer's
largest activations. With ``checkpoint=True`` neither is kept for backward: backward runs FC1's
GEMM and the activation again from what the layer keeps anyway, then the usual backward. FC2 is
not run again (its backward needs a, not its output).

Quantized (inside ``te.autocast``), LayerNormMLPRecomputeFn:

    saved       x, gamma, mu, rsigma (norm backward), FC1's quantized input lnq (its row-wise
                copy for the recompute, its column-wise copy for FC1's wgrad), the quantized
                weights w1q (row-wise: the recompute; column-wise: FC1's dgrad) and w2q, fc1_bias
    not saved   h (high precision) and FC2's quantized input aq (its column-wise copy, FC2's wgrad)
    backward    h = gemm(lnq, w1q) (+ b1); aq = act(h) quantized as the forward did; then
                LayerNormMLPFn's op-by-op backward on them

Bit for bit what ``checkpoint=False`` gives: the recompute is the forward's own calls on the
forward's own operands, and nothing in it is quantized afresh except aq, with FC2's input
quantizer as the forward used it. Under DelayedScaling that quantizer reads the scale the
forward read (a copy taken then: the autocast exit between forward and backward moves the scale
on) and records its amax into a scratch slot, so the recompute leaves the amax histories and
scales as they were. Current and block scaling (and MXFP8 / NVFP4) derive their scales from the
data, which is the forward's again; FC2's input quantizer never rounds stochastically (the recipes
round gradients only), and NVFP4's Hadamard transform uses a fixed sign vector.

The checkpointed layer always takes the op-by-op path (the fused eager step of
_layernorm_mlp_step keeps h in its saved buffer); under ``torch.no_grad()`` nothing is saved and
the module runs as without the flag.

High precision (outside ``te.autocast``), recomputed_mlp: the same autograd graph as without the
flag, run under saved_tensors_hooks that keep, in place of h and a, a note of which they were;
the first backward node that needs one runs FC1 and the activation again (both are
deterministic: the same bytes) and the graph's own backward nodes proceed. Tensors the hooks do
not replace go to the enclosing saved_tensors_hooks, if any (CPU offloading, a non-reentrant
te.checkpoint), as they would without the flag. The recompute's inputs (the norm output,
fc1_weight, fc1_bias) changed in place before it runs raise, as autograd's saved tensors do (the
hooks' tensors skip autograd's check).
"""

from __future__ import annotations

import torch

from te_torch import _fused
from te_torch._high_precision import activation, linear
from te_torch._layernorm_mlp_fn import LayerNormMLPFn, keep_config, needs, op_by_op_forward
from te_torch._linear_step import gemm_bias
from te_torch.functional import gemm

__all__ = ["LayerNormMLPRecomputeFn", "recomputed_mlp"]

# LayerNormMLPFn.backward as the plain function it is (torch.compile reads a call through the
# Function class as the Function's own backward, which takes its ctx only)
_op_by_op_backward = LayerNormMLPFn.__dict__["backward"].__func__


class _Recomputed:
    """A LayerNormMLPRecomputeFn ctx as LayerNormMLPFn.backward reads it: the op-by-op path,
    with the recomputed h and aq among the saved tensors. Reusing that backward, rather than a
    copy of it, is what keeps the two flags' gradients the same bytes. A plain object with the
    attributes copied (torch.compile traces it; a delegating __getattr__ it does not)."""

    def __init__(self, ctx, saved: tuple) -> None:
        self.packed, self.saved_tensors, self.needs_input_grad = False, saved, ctx.needs_input_grad
        self.c, self.cfg, self.fuse, self.weights = ctx.c, ctx.cfg, ctx.fuse, ctx.weights
        self.w_dtypes, self.b_dtypes, self.has_ln_bias = ctx.w_dtypes, ctx.b_dtypes, ctx.has_ln_bias


class LayerNormMLPRecomputeFn(torch.autograd.Function):
    """LayerNormMLPFn's op-by-op forward and backward (same arguments, same outputs) with h and
    aq recomputed in backward instead of saved; see the module docstring."""

    @staticmethod
    def forward(ctx, inp, ln_w, ln_b, w1, b1, w2, b2, c1, c2, first, fuse_wgrad: bool, cfg: tuple):
        need_dln, need_dw1, need_dh, need_dw2 = needs(inp, ln_w, ln_b, w1, b1, w2)
        recompute = need_dh or need_dw2  # backward reads h (act backward) or aq (FC2's wgrad)
        out, ln_out, mu, rsigma, lnq, w1q, _, _, w2q = op_by_op_forward(
            inp, ln_w, ln_b, w1, b1, w2, b2, c1, c2, first, cfg, need_dln, need_dw1, need_dh, need_dw2
        )
        ctx.save_for_backward(
            inp if need_dln else None,
            ln_w if need_dln else None,
            mu if need_dln else None,
            rsigma if need_dln else None,
            lnq if recompute else None,
            w1q if recompute or need_dln else None,
            b1 if recompute else None,
            w2q if need_dh else None,
        )
        # DelayedScaling: the scale aq was quantized with, for its recompute (see the docstring)
        ctx.scale2 = c2.fwd.scale_of(0).clone() if c2.delayed and need_dw2 else None
        keep_config(ctx, c1, c2, fuse_wgrad, cfg, w1, b1, w2, b2, ln_b)
        ctx.dtype = inp.dtype
        return (out, ln_out) if cfg[4] else out

    @staticmethod
    def backward(ctx, dy, d_ln_out=None):
        inp, ln_w, mu, rsigma, lnq, w1q, b1, w2q = ctx.saved_tensors
        c1, c2 = ctx.c
        need_dx, need_dlnw, need_dlnb, need_dw1, need_db1, need_dw2 = ctx.needs_input_grad[:6]
        need_dh = need_dx or need_dlnw or need_dlnb or need_dw1 or need_db1
        h = aq = None
        if dy is not None and (need_dh or need_dw2):  # what LayerNormMLPFn.backward reads
            h = gemm(
                lnq,
                w1q,
                bias=gemm_bias(b1, ctx.dtype),
                out_dtype=ctx.dtype,
                use_split_accumulator=c1.split[0],
            )
            if need_dw2:
                aq = _fused.activation_fwd(h, ctx.cfg[3], _replay_quantizer(ctx, c2), ctx.cfg[5])
        saved = (inp, ln_w, mu, rsigma, lnq, w1q, h if need_dh else None, aq, w2q)
        return _op_by_op_backward(_Recomputed(ctx, saved), dy, d_ln_out)


def _replay_quantizer(ctx, c2):
    """FC2's input quantizer as the forward used it (row- and column-wise: the same kernel call,
    of which backward reads the column-wise copy). DelayedScaling: with the forward's scale and a
    scratch amax, so the recompute records nothing."""
    q = c2.x_q[3]
    if ctx.scale2 is None:
        return q
    q = q.copy()
    q.scale, q.amax = ctx.scale2, torch.zeros_like(ctx.scale2)
    return q


# -- high precision ----------------------------------------------------------------------------

# the enclosing saved_tensors_hooks, which the hooks here pass other tensors to (torch's own
# accessor; without it, in an older torch, those tensors are kept as they are)
_top_hooks = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)


class _Dropped:
    """What the hooks keep of a saved tensor that is a view of h (``which`` 0) or a (1)."""

    __slots__ = ("which", "size", "stride", "offset")

    def __init__(self, which: int, t: torch.Tensor) -> None:
        self.which, self.size, self.stride, self.offset = which, t.size(), t.stride(), t.storage_offset()


class _Hooks:
    """saved_tensors_hooks of one high-precision forward (see the module docstring). ``watch``
    names h and a as they are made; a saved tensor in the storage of either is dropped, any other
    goes to the enclosing hooks (or is kept as it is). Backward's first unpack of a dropped one
    recomputes both; they are released once every dropped tensor has been unpacked (and made
    again if a retained graph runs backward again)."""

    __slots__ = ("args", "versions", "act", "storages", "values", "dropped", "left", "outer")

    def __init__(self, ln_out, w1, b1, act: tuple) -> None:
        self.args, self.act = (ln_out, w1, b1), act  # act: (kind, params)
        self.versions = _versions(self.args)
        self.storages: list = []
        self.values = None
        self.dropped = self.left = 0
        self.outer = _top_hooks(False) if _top_hooks is not None else None  # (pack, unpack)

    def watch(self, t: torch.Tensor) -> None:
        # a fresh contiguous tensor (F.linear's and the activation's outputs): its recompute has
        # the same layout, so a view of it is the same view of the recompute
        if t.numel() and t.is_contiguous() and t.storage_offset() == 0:
            self.storages.append((t.untyped_storage().data_ptr(), t.dtype, t.device))

    def pack(self, t: torch.Tensor):
        if t.numel():
            key = (t.untyped_storage().data_ptr(), t.dtype, t.device)
            for which, storage in enumerate(self.storages):
                if key == storage:
                    self.dropped += 1
                    self.left += 1
                    return _Dropped(which, t)
        if self.outer is not None:
            return (self.outer[1], self.outer[0](t))
        return t

    def unpack(self, packed):
        if isinstance(packed, tuple):
            return packed[0](packed[1])
        if not isinstance(packed, _Dropped):
            return packed
        if self.values is None:
            if _versions(self.args) != self.versions:
                # autograd's own check of a saved tensor: the hooks' tensors skip it
                raise RuntimeError(
                    "LayerNormMLP(checkpoint=True): the norm output, fc1_weight or fc1_bias was "
                    "modified by an inplace operation after the forward, and backward recomputes "
                    "FC1 from them; modify them only after backward (or use checkpoint=False)"
                )
            ln_out, w1, b1 = self.args
            with torch.no_grad():
                h = linear(ln_out, w1, b1, False)
                self.values = (h, activation(h, *self.act))
        t = self.values[packed.which]
        self.left -= 1
        if self.left == 0:
            self.values, self.left = None, self.dropped
        return t.as_strided(packed.size, packed.stride, packed.offset)


def _versions(ts: tuple) -> tuple:
    return tuple(None if t is None else t._version for t in ts)


@torch.compiler.disable
def recomputed_mlp(ln_out, w1, b1, w2, b2, act: tuple, fuse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, a): ``linear(activation(linear(ln_out, w1, b1), *act), w2, b2)`` (``act``: the
    activation's kind and params) as the module computes it without the flag, with h and a
    dropped from what backward keeps (the module docstring). Eager under torch.compile: the
    hooks and their recompute run outside the trace."""
    hooks = _Hooks(ln_out, w1, b1, act)
    with torch.autograd.graph.saved_tensors_hooks(hooks.pack, hooks.unpack):
        h = linear(ln_out, w1, b1, fuse)
        hooks.watch(h)
        a = activation(h, *act)
        hooks.watch(a)
        out = linear(a, w2, b2, fuse)
    return out, a
