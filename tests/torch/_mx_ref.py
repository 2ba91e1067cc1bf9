"""An independent MXFP8 / NVFP4 reference in plain torch (NUMERICS.md), for te's modules.

Quantize-dequantize in fp32, written out from NUMERICS.md and te/quantize.h's contract, trusting
only torch's own float8 conversion (round to nearest even; clamped first, so it saturates):

- MXFP8: per block of 32 (or 32x32 tile) e = E8M0(block_amax / fp8_max) rounded up (fp32
  exponent bits, +1 if any mantissa bit is set, capped at 0xFE; amax 0 -> 0),
  q = fp8(x * 2^(127 - e)), value q * 2^(e - 127).
- NVFP4: per copy S_enc = 2688 / amax (amax 0 or inf -> 1, inf -> FLT_MAX); per block of 16 (or
  16x16 tile) s_block = e4m3(block_amax / 6 * S_enc); enc = S_enc / s_block (0 if s_block is 0);
  q = e2m1(x * enc) round to nearest even, saturating at 6; value (q * s_block) * (1 / S_enc).
  With the random Hadamard transform, each run of 16 along the copy's rows is first multiplied
  by (1/4) diag(s) H16, computed as te/quantize.h fixes it (signs, then the radix-2 butterfly
  with strides 1, 2, 4, 8, then * 1/4), so the reference rounds exactly as te does.

te_gemm emulates both formats by rounding the dequantized operands to BF16 and multiplying with
fp32 accumulation (te/gemm.h), so ``gemm_operand`` rounds to BF16 too: MXFP8 values are exact in
BF16, NVFP4's (q * s_block) * s_global are not. Products here are float64.

The module references use te's fp32 norm / activation kernels for the values a module quantizes
after a norm or an activation (te_norm32 & co. from _module_ref, each checked against the fp32
torch formulas in its own tests): the module promises "te's fp32 op, then quantize", and an fp32
rounding difference in torch's own formula would move an element across a rounding boundary now
and then. Everything after (quantization, GEMMs, the norm backward) is plain torch here.
Stochastic rounding is not reproduced (it is te-core's Philox stream, checked bit for bit in
tests/core): tight comparisons use ``disable_stochastic_rounding=True``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _module_ref import act32, norm32, te_act32, te_act_bwd32, te_norm32
from te_torch import recipe

FLT_MAX = torch.finfo(torch.float32).max
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
SIGNS = torch.tensor([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], dtype=torch.float32)


def _blocks(x: torch.Tensor, rows: int, cols: int) -> tuple[torch.Tensor, tuple[int, int]]:
    """fp32 [R, C] zero-padded to multiples of (rows, cols), as [R'/rows, rows, C'/cols, cols]
    (zeros change no block's amax: edge blocks use only their valid elements)."""
    r, c = x.shape
    rp, cp = -(-r // rows) * rows, -(-c // cols) * cols
    pad = torch.zeros(rp, cp, dtype=torch.float32)
    pad[:r, :c] = x
    return pad.reshape(rp // rows, rows, cp // cols, cols), (r, c)


def _unblock(b: torch.Tensor, rc: tuple[int, int]) -> torch.Tensor:
    n0, rows, n1, cols = b.shape
    return b.reshape(n0 * rows, n1 * cols)[: rc[0], : rc[1]]


def e8m0_round_up(v: torch.Tensor) -> torch.Tensor:
    """The E8M0 exponent byte (int32) of fp32 ``v`` >= 0, rounded up; 0 for 0."""
    bits = v.contiguous().view(torch.int32)
    e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return torch.where(v == 0, 0, e.clamp(max=0xFE))


def mxfp8_qdq(x: torch.Tensor, fp8_dtype: torch.dtype, tile: bool = False) -> torch.Tensor:
    """The values te's MXFP8 row-wise copy of fp32 [R, C] holds (blocks of 32 along rows, or
    32x32 tiles), as fp32 [R, C]."""
    b, rc = _blocks(x.float(), 32 if tile else 1, 32)
    e = e8m0_round_up(b.abs().amax(dim=(1, 3), keepdim=True) / FP8_MAX[fp8_dtype])
    one = torch.ones(e.shape, dtype=torch.float32)
    m = FP8_MAX[fp8_dtype]
    q = (b * torch.ldexp(one, 127 - e)).clamp(-m, m).to(fp8_dtype).float()
    return _unblock(q * torch.ldexp(one, e - 127), rc)


def rht16(x: torch.Tensor) -> torch.Tensor:
    """Each run of 16 along the last dim of fp32 [R, C] times (1/4) diag(s) H16, in te's order."""
    v = x.reshape(-1, 16) * SIGNS
    h = 1
    while h < 16:
        v = v.reshape(-1, 16 // (2 * h), 2, h)
        a, b = v[:, :, 0, :], v[:, :, 1, :]
        v = torch.stack((a + b, a - b), dim=2)
        h *= 2
    return v.reshape(x.shape) * 0.25


def e2m1_round(v: torch.Tensor) -> torch.Tensor:
    """fp32 -> the nearest of +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}, ties to the even code, saturating."""
    a = v.abs().clamp(max=6.0)
    q = torch.where(a < 2, torch.round(a * 2) / 2, torch.where(a < 4, torch.round(a), torch.round(a / 2) * 2))
    return q.copysign(v)


def nvfp4_qdq(x: torch.Tensor, tile: bool = False, rht: bool = False) -> torch.Tensor:
    """The values te's NVFP4 row-wise copy of fp32 [R, C] holds (blocks of 16 along rows, or
    16x16 tiles; with ``rht`` the copy of the transformed source), as fp32 [R, C]."""
    x = x.float()
    if rht:
        x = rht16(x)
    amax = x.abs().amax()
    s_enc = torch.tensor(2688.0) / amax if 0 < amax < float("inf") else torch.tensor(1.0)
    s_enc = s_enc.clamp(max=FLT_MAX)
    b, rc = _blocks(x, 16 if tile else 1, 16)
    s_block = (b.abs().amax(dim=(1, 3), keepdim=True) / 6.0 * s_enc).clamp(max=448.0).to(E4M3).float()
    enc = torch.where(s_block == 0, 0.0, (s_enc / s_block).clamp(max=FLT_MAX))
    q = e2m1_round(b * enc)
    return _unblock(q * s_block * (1.0 / s_enc), rc)


def bf16(v: torch.Tensor) -> torch.Tensor:
    """What te_gemm multiplies: the dequantized value rounded to BF16, as float64."""
    return v.to(torch.bfloat16).double()


class Roles:
    """How a recipe quantizes a GEMM's input x, weight w and grad-output g (NUMERICS.md): each
    method gives the BF16-rounded float64 values of one copy of a 2-D fp32 source [R, C]; the
    column-wise copy is returned in the source's orientation [R, C] (transposed back; for NVFP4
    with the transform it stays in the transformed domain, [C, R] as stored, see ``wgrad``)."""

    def __init__(self, r) -> None:
        self.r = r
        self.mx = r.mxfp8()
        if self.mx:
            self.g_dtype = E5M2 if r.fp8_format == recipe.Format.HYBRID else E4M3
            self.w_tile = r.enable_2d_quantization
        else:
            self.rht = r.fp4_quant_fwd_inp.random_hadamard_transform
            self.w_tile = r.fp4_quant_fwd_weight.fp4_2d_quantization
            assert not r.fp4_quant_bwd_grad.stochastic_rounding, "SR is not reproduced here"

    def _qdq(self, x, dtype, tile=False, rht=False):
        return bf16(mxfp8_qdq(x, dtype, tile) if self.mx else nvfp4_qdq(x, tile, rht))

    def row(self, x: torch.Tensor, role: str) -> torch.Tensor:
        """Row-wise copy (fprop operands; dgrad's dy)."""
        dtype = self.g_dtype if (self.mx and role == "g") else E4M3
        return self._qdq(x, dtype, tile=role == "w" and self.w_tile)

    def col_w(self, w: torch.Tensor) -> torch.Tensor:
        """The weight's column-wise copy, [N, K] orientation (dgrad)."""
        return self._qdq(w.T, E4M3, tile=self.w_tile).T

    def wgrad(self, g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """dw [N, K] = g^T x from the column-wise copies of g [M, N] and x [M, K] (with the
        transform on both, the stored copies' product: the transforms cancel)."""
        if self.mx:
            return self._qdq(g.T, self.g_dtype).double() @ self._qdq(x.T, E4M3).T
        return self._qdq(g.T, None, rht=self.rht) @ self._qdq(x.T, None, rht=self.rht).T


def _2d(t: torch.Tensor) -> torch.Tensor:
    return t.detach().float().reshape(-1, t.shape[-1])


def linear_ref(r, x, w, b, dy):
    """(y, dx, dw, db) of y = x w^T + b as te.Linear runs it under ``r``, float64 [..., N]."""
    q = Roles(r)
    x2, w2, g2 = _2d(x), w.detach().float(), _2d(dy)
    y = q.row(x2, "x") @ q.row(w2, "w").T + (0 if b is None else b.detach().double())
    dx = q.row(g2, "g") @ q.col_w(w2)
    dw = q.wgrad(g2, x2)
    db = g2.double().sum(0)
    lead = x.shape[:-1]
    return y.reshape(*lead, -1), dx.reshape(*lead, -1), dw, db


def layernorm_linear_ref(m, r, x, dy):
    """(y, dx, dln_weight, dln_bias, dweight, dbias) of te.LayerNormLinear ``m`` under ``r``."""
    q = Roles(r)
    rms = m.normalization == "RMSNorm"
    lw = m.layer_norm_weight.detach()
    lb = None if m.layer_norm_bias is None else m.layer_norm_bias.detach()
    w2, g2 = m.weight.detach().float(), _2d(dy)
    ln = _2d(te_norm32(x, lw, lb, rms, m.eps, m.zero_centered_gamma))
    y = q.row(ln, "x") @ q.row(w2, "w").T + m.bias.detach().double()
    dln = q.row(g2, "g") @ q.col_w(w2)
    dw = q.wgrad(g2, ln)
    x32 = x.detach().float().clone().requires_grad_(True)
    lw32 = lw.float().requires_grad_(True)
    lb32 = None if lb is None else lb.float().requires_grad_(True)
    norm32(x32, lw32, lb32, rms, m.eps, m.zero_centered_gamma).backward(dln.float().reshape(x.shape))
    return (
        y.reshape(*x.shape[:-1], -1),
        x32.grad,
        lw32.grad,
        None if lb32 is None else lb32.grad,
        dw,
        g2.double().sum(0),
    )


def layernorm_mlp_ref(m, r, x, dy):
    """(y, dx, dln_weight, dln_bias, dfc1_weight, dfc1_bias, dfc2_weight, dfc2_bias) of
    te.LayerNormMLP ``m`` under ``r``. The intermediate GEMM outputs a module quantizes again
    (FC1's pre-activation h, FC2's dgrad da) are rounded to x's dtype here as te's GEMMs write
    them."""
    q = Roles(r)
    rms = m.normalization == "RMSNorm"
    dt = x.dtype
    lw = m.layer_norm_weight.detach()
    lb = None if m.layer_norm_bias is None else m.layer_norm_bias.detach()
    w1, w2 = m.fc1_weight.detach().float(), m.fc2_weight.detach().float()
    b1, b2 = m.fc1_bias.detach().double(), m.fc2_bias.detach().double()
    g2 = _2d(dy)
    ln = _2d(te_norm32(x, lw, lb, rms, m.eps, m.zero_centered_gamma))
    h = (q.row(ln, "x") @ q.row(w1, "w").T + b1).to(dt)
    a32 = _2d(te_act32(h, m.activation))
    y = q.row(a32, "x") @ q.row(w2, "w").T + b2
    da = (q.row(g2, "g") @ q.col_w(w2)).to(dt)
    dw2 = q.wgrad(g2, a32)
    dh32 = _2d(te_act_bwd32(da, h, m.activation))
    dln = q.row(dh32, "g") @ q.col_w(w1)
    dw1 = q.wgrad(dh32, ln)
    x32 = x.detach().float().clone().requires_grad_(True)
    lw32 = lw.float().requires_grad_(True)
    lb32 = None if lb is None else lb.float().requires_grad_(True)
    norm32(x32, lw32, lb32, rms, m.eps, m.zero_centered_gamma).backward(dln.float().reshape(x.shape))
    return (
        y.reshape(*x.shape[:-1], -1),
        x32.grad,
        lw32.grad,
        None if lb32 is None else lb32.grad,
        dw1,
        dh32.double().sum(0),
        dw2,
        g2.double().sum(0),
    )


def fp32_layernorm_mlp(m, x, dy):
    """The unquantized fp32 LayerNormMLP (torch formulas): (y, dx, and every parameter's grad)."""
    ps = [m.layer_norm_weight, m.layer_norm_bias, m.fc1_weight, m.fc1_bias, m.fc2_weight, m.fc2_bias]
    leaves = [None if p is None else p.detach().float().requires_grad_(True) for p in ps]
    lw, lb, w1, b1, w2, b2 = leaves
    x32 = x.detach().float().clone().requires_grad_(True)
    ln = norm32(x32, lw, lb, m.normalization == "RMSNorm", m.eps, m.zero_centered_gamma)
    y = F.linear(act32(F.linear(ln, w1, b1), m.activation), w2, b2)
    y.backward(dy.float())
    return (y.detach(), x32.grad, *[None if p is None else p.grad for p in leaves])
