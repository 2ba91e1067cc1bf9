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
from te_core._ops import ACTIVATIONS, activation_params
from te_torch import _fused_kernels, recipe

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
RECIPES = {
    "delayed": recipe.DelayedScaling,
    "current": recipe.Float8CurrentScaling,
    "block": recipe.Float8BlockScaling,
}
GATED = ("geglu", "reglu", "swiglu", "qgeglu", "sreglu", "glu", "clamped_swiglu")


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
    if r.mxfp8():
        g = E5M2 if r.fp8_format == recipe.Format.HYBRID else E4M3
        return (
            te.MXFP8Quantizer(E4M3),
            te.MXFP8Quantizer(E4M3, with_2d_quantization=r.enable_2d_quantization),
            te.MXFP8Quantizer(g),
        )
    return (
        te.Float8BlockQuantizer(E4M3, block_scaling_dim=r.x_block_scaling_dim),
        te.Float8BlockQuantizer(E4M3, block_scaling_dim=r.w_block_scaling_dim),
        te.Float8BlockQuantizer(E4M3, block_scaling_dim=r.grad_block_scaling_dim),
    )


def ref_io_quantizers(r, fwd_scale=None, bwd_scale=None):
    """Fresh quantizers configured as a te module's output (fp8_output) and grad-input (fp8_grad)
    quantizers for recipe ``r``: (output, grad_input), making every copy the module returns.
    ``fwd_scale`` [3] / ``bwd_scale`` [2]: the delayed-scaling scales the step uses."""
    g = E5M2 if r.fp8_format == recipe.Format.HYBRID else E4M3
    if r.delayed():
        fs = torch.ones(3) if fwd_scale is None else fwd_scale.clone()
        bs = torch.ones(2) if bwd_scale is None else bwd_scale.clone()
        return (
            te.Float8Quantizer(fs[2:3], torch.zeros(1), E4M3, columnwise=False),
            te.Float8Quantizer(bs[1:2], torch.zeros(1), g, columnwise=False),
        )
    if r.float8_current_scaling():
        return (
            te.Float8CurrentScalingQuantizer(E4M3, columnwise=False),
            te.Float8CurrentScalingQuantizer(g, columnwise=False),
        )
    if r.mxfp8():  # both copies: each has its own blocks
        return te.MXFP8Quantizer(E4M3), te.MXFP8Quantizer(g)
    return (
        te.Float8BlockQuantizer(E4M3, block_scaling_dim=r.x_block_scaling_dim),
        te.Float8BlockQuantizer(E4M3, block_scaling_dim=r.grad_block_scaling_dim),
    )


def copies(t) -> dict:
    """{"row" / "col": (FP8 bytes, fp32 values)} of each copy a quantized tensor holds."""
    if isinstance(t, te.Float8Tensor):
        parts = {"row": (t._data, t._like(t._data, None, t._scale_inv)) if t._data is not None else None}
        parts["col"] = (
            (t._transpose, t._like(None, t._transpose, t._scale_inv)) if t._transpose is not None else None
        )
    else:
        rd, rs, cd, cs = t._parts()
        parts = {
            "row": (rd, t._like(rd, rs, None, None)) if rd is not None else None,
            "col": (cd, t._like(None, None, cd, cs)) if cd is not None else None,
        }
    return {k: (v[0].view(torch.uint8), v[1].dequantize(torch.float32)) for k, v in parts.items() if v}


def assert_same_quantized(got, want) -> None:
    """``got`` holds the same copies as ``want``, bit for bit (bytes and dequantized values, which
    also compares the scales where they are read), with the same type, shape and dtypes."""
    assert type(got) is type(want), (type(got), type(want))
    assert got.shape == want.shape and got.dtype == want.dtype and got._fp8_dtype == want._fp8_dtype
    g, w = copies(got), copies(want)
    assert set(g) == set(w), (set(g), set(w))
    for k in g:
        assert torch.equal(g[k][0], w[k][0]), k
        assert torch.equal(g[k][1].view(torch.int32), w[k][1].view(torch.int32)), k


def gemm_scales(state) -> tuple:
    """(fwd_scale, bwd_scale) a GemmState's next delayed-scaling step uses (None: no state)."""
    if state.fwd is None:
        return None, None
    return state.fwd.scale.clone(), state.bwd.scale.clone()


# -- delayed scaling by hand (NUMERICS.md "DelayedScaling") ----------------------------------------


def with_amax(shape, amax, seed):
    """Random values in (-amax/2, amax/2) with one element exactly +-amax: max|t| == amax."""
    g = torch.Generator().manual_seed(seed)
    t = (torch.rand(shape, generator=g) - 0.5) * amax
    t.view(-1)[3] = -amax
    return t


def hand_update(history, scale, fp8_max, margin, algo):
    """NUMERICS.md DelayedScaling update, written out on python lists of fp32 values per role."""
    new_hist, new_scale = [], []
    for h, s in zip(history, scale, strict=True):
        amax = max(h) if algo == "max" else h[0]
        if amax > 0 and amax != float("inf"):
            s = (
                torch.tensor(fp8_max * 2.0**-margin, dtype=torch.float32)
                / torch.tensor(amax, dtype=torch.float32)
            ).item()
        new_scale.append(s)
        new_hist.append([0.0] + h[2:] + [h[0]] if len(h) > 1 else [0.0])
    return new_hist, new_scale


def columns(t):
    """A [L, n] history as n python lists (one per role)."""
    return [t[:, i].tolist() for i in range(t.shape[1])]


def delayed_states(module) -> list:
    """Copies of the amax histories and scales of every te module in ``module`` (in
    module order, forward then backward, those that exist)."""
    return [
        t.clone()
        for mod in module.modules()
        if hasattr(mod, "_gemms")
        for g in mod._gemms.values()
        for st in (g.fwd, g.bwd)
        if st is not None
        for t in (st.amax_history, st.scale)
    ]


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


def clamped_swiglu32(a, b, params=None) -> torch.Tensor:
    """GPT-OSS's clamped SwiGLU as TE defines it, in fp32 torch ops (autograd-able: torch.clamp's
    gradient is zero beyond the bounds). ``params``: TE's activation_params dict, None for the
    defaults (limit 7, alpha 1.702, glu_linear_offset 1)."""
    p = {"limit": 7.0, "alpha": 1.702, "glu_linear_offset": 1.0, **(params or {})}
    a = a.clamp(max=p["limit"])
    b = b.clamp(min=-p["limit"], max=p["limit"])
    return a * torch.sigmoid(p["alpha"] * a) * (b + p["glu_linear_offset"])


def act32(h, name: str, params=None) -> torch.Tensor:
    """TE's activation ``name`` in fp32 torch ops; gated: act(first half) * second half.
    ``params``: clamped_swiglu's activation_params."""
    h = h.float()
    if name == "clamped_swiglu":
        return clamped_swiglu32(*h.chunk(2, dim=-1), params)
    if name in GATED:
        a, b = h.chunk(2, dim=-1)
        return _ACT[name](a) * b
    return _ACT[name](h)


# -- te's own fp32 kernels (what a fused kernel's quantized output is made from) --------------


def te_norm32(x, weight, bias, rms: bool, eps: float, zcg: bool) -> torch.Tensor:
    """te's norm of x (any dtype) with an fp32 output."""
    return _fused_kernels.norm_fwd(x, weight, bias, rms, eps, zcg, None, torch.float32)[0]


def te_act32(h, name: str, params=None) -> torch.Tensor:
    """te's activation of h with an fp32 output (``params``: TE's activation_params dict)."""
    p = activation_params(name, params)
    return _fused_kernels.activation_fwd(h, ACTIVATIONS[name], None, torch.float32, p)[0]


def te_act_bwd32(grad, h, name: str, params=None) -> torch.Tensor:
    """te's activation backward of h with an fp32 dx."""
    p = activation_params(name, params)
    return _fused_kernels.activation_bwd(grad, h, ACTIVATIONS[name], None, torch.float32, None, p)[0]
