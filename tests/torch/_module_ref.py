"""References for te's modules in plain torch (NUMERICS.md "How to test numerics").

- The fp32 reference: the module's math in float32 torch ops (F.layer_norm, F.linear, the
  activation formulas of te/activation.h written out here).
- The emulated reference: te's quantizers (themselves checked bit for bit against the oracle in
  conftest.py), dequantized, then fp32 torch math. Where a module quantizes the output of a
  fused kernel, the emulation quantizes that kernel's fp32 result (te's fp32 norm / activation,
  each checked against the fp32 formulas in its own tests), since the fused kernel promises the
  bits of "fp32 op, then quantize".
"""

from __future__ import annotations

import te_torch as te
import torch
import torch.nn.functional as F
from te_core._ops import ACTIVATIONS
from te_torch import _fused_kernels, recipe

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
RECIPES = {
    "delayed": recipe.DelayedScaling,
    "current": recipe.Float8CurrentScaling,
    "block": recipe.Float8BlockScaling,
}
GATED = ("geglu", "reglu", "swiglu", "qgeglu", "sreglu", "glu")


def rel(a, b) -> float:
    """Normwise relative error of a against b, in float64."""
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def deq(q, x, row: bool) -> torch.Tensor:
    """fp32 values of x's row-wise (or column-wise) copy as ``q`` quantizes it."""
    q = q.copy()
    q.set_usage(rowwise=row, columnwise=not row)
    return q(x).dequantize(dtype=torch.float32)


def ref_quantizers(r, fwd_scale=None, bwd_scale=None):
    """Fresh quantizers configured as a te module's GEMM for recipe ``r``: (x, w, dy).
    ``fwd_scale`` [3] / ``bwd_scale`` [2]: the delayed-scaling scales the step uses."""
    if r.delayed():
        g = E5M2 if r.fp8_format == recipe.Format.HYBRID else E4M3
        fs = torch.ones(3) if fwd_scale is None else fwd_scale.clone()
        bs = torch.ones(2) if bwd_scale is None else bwd_scale.clone()
        return (
            te.Float8Quantizer(fs[0:1], torch.zeros(1), E4M3),
            te.Float8Quantizer(fs[1:2], torch.zeros(1), E4M3),
            te.Float8Quantizer(bs[0:1], torch.zeros(1), g),
        )
    if r.float8_current_scaling():
        g = E5M2 if r.fp8_format == recipe.Format.HYBRID else E4M3
        return (
            te.Float8CurrentScalingQuantizer(E4M3),
            te.Float8CurrentScalingQuantizer(E4M3),
            te.Float8CurrentScalingQuantizer(g),
        )
    return (
        te.Float8BlockQuantizer(E4M3, block_scaling_dim=r.x_block_scaling_dim),
        te.Float8BlockQuantizer(E4M3, block_scaling_dim=r.w_block_scaling_dim),
        te.Float8BlockQuantizer(E4M3, block_scaling_dim=r.grad_block_scaling_dim),
    )


def gemm_scales(state) -> tuple:
    """(fwd_scale, bwd_scale) a GemmState's next delayed-scaling step uses (None: no state)."""
    if state.fwd is None:
        return None, None
    return state.fwd.scale.clone(), state.bwd.scale.clone()


# -- fp32 formulas ----------------------------------------------------------------------------


def norm32(x, weight, bias, rms: bool, eps: float, zero_centered_gamma: bool) -> torch.Tensor:
    """LayerNorm / RMSNorm over the last dim in fp32 torch ops (autograd-able)."""
    x = x.float()
    g = weight.float() + (1.0 if zero_centered_gamma else 0.0)
    if rms:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g
    return F.layer_norm(x, (x.shape[-1],), g, None if bias is None else bias.float(), eps)


def _gelu(x):
    return F.gelu(x, approximate="tanh")


def _qgelu(x):
    return x * torch.sigmoid(1.702 * x)


def _srelu(x):
    return F.relu(x) ** 2


_ACT = {
    "gelu": _gelu,
    "relu": F.relu,
    "silu": F.silu,
    "qgelu": _qgelu,
    "srelu": _srelu,
    "geglu": _gelu,
    "reglu": F.relu,
    "swiglu": F.silu,
    "qgeglu": _qgelu,
    "sreglu": _srelu,
    "glu": torch.sigmoid,
}


def act32(h, name: str) -> torch.Tensor:
    """TE's activation ``name`` in fp32 torch ops; gated: act(first half) * second half."""
    h = h.float()
    if name in GATED:
        a, b = h.chunk(2, dim=-1)
        return _ACT[name](a) * b
    return _ACT[name](h)


# -- te's own fp32 kernels (what a fused kernel's quantized output is made from) --------------


def te_norm32(x, weight, bias, rms: bool, eps: float, zcg: bool) -> torch.Tensor:
    """te's norm of x (any dtype) with an fp32 output."""
    return _fused_kernels.norm_fwd(x, weight, bias, rms, eps, zcg, None, torch.float32)[0]


def te_act32(h, name: str) -> torch.Tensor:
    return _fused_kernels.activation_fwd(h, ACTIVATIONS[name], None, torch.float32)[0]


def te_act_bwd32(grad, h, name: str) -> torch.Tensor:
    """te's activation backward of h with an fp32 dx."""
    return _fused_kernels.activation_bwd(grad, h, ACTIVATIONS[name], None, torch.float32, None)[0]
