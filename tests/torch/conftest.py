"""Independent oracles for te_torch's quantizers, in plain torch (NUMERICS.md).

Only torch's own float8 conversion (round to nearest even) is trusted; saturation, scale rules,
block partitioning and the stored scale layouts are written out here. Exposed as the `oracle`
fixture (test modules are imported with --import-mode=importlib, so they cannot import this).
The module references (_module_ref.py) are imported by the tests from this folder, which is put
on sys.path here.
"""

import os
import sys
import types

import pytest
import torch

_here = os.path.dirname(os.path.abspath(__file__))
if _here not in sys.path:
    sys.path.insert(0, _here)

FLT_MAX = torch.finfo(torch.float32).max
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
BLOCK = 128


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes/words of a tensor, for bit-exact comparisons (NaN == NaN)."""
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def cast(x32: torch.Tensor, scale, fp8_dtype) -> torch.Tensor:
    """q = fp8(x * scale) in fp32, saturating finite values and inf to +-max, NaN stays NaN."""
    m = FP8_MAX[fp8_dtype]
    return (x32 * scale).clamp(-m, m).to(fp8_dtype)


def scale_from_amax(amax: torch.Tensor, fp8_max: float, pow2: bool, eps: float) -> torch.Tensor:
    """NUMERICS.md current/block rule, elementwise on an fp32 tensor of amaxes."""
    a = torch.where(amax < eps, torch.full_like(amax, eps), amax)  # NaN < eps is False
    ok = torch.isfinite(a) & (a != 0)
    s = torch.where(ok, torch.full_like(a, fp8_max) / torch.where(ok, a, 1.0), 1.0)
    s = torch.where(torch.isinf(s), torch.full_like(s, FLT_MAX), s)
    if pow2:
        s = (s.view(torch.int32) & -8388608).view(torch.float32)  # & 0xFF800000
    return s


def as_matrix(x: torch.Tensor) -> torch.Tensor:
    k = x.shape[-1] if x.dim() else 1
    return x.float().reshape(-1, k)


def nan_amax(t: torch.Tensor, dims) -> torch.Tensor:
    a = t.abs().amax(dim=dims)
    return torch.where(torch.isnan(t).any(dim=dims), torch.nan, a) if t.numel() else a


def block_1d(x2: torch.Tensor, fp8_dtype, pow2: bool, eps: float):
    """1x128 blocks along rows of fp32 [M, K]: (q [M, K], scale_inv [M, ceil(K/128)])."""
    m, k = x2.shape
    kb = -(-k // BLOCK)
    pad = torch.zeros(m, kb * BLOCK)
    pad[:, :k] = x2
    blocks = pad.reshape(m, kb, BLOCK)
    scale = scale_from_amax(nan_amax(blocks, 2), FP8_MAX[fp8_dtype], pow2, eps)  # [M, kb]
    q = cast(blocks, scale[:, :, None], fp8_dtype).reshape(m, kb * BLOCK)[:, :k]
    return q, 1.0 / scale


def block_2d(x2: torch.Tensor, fp8_dtype, pow2: bool, eps: float):
    """128x128 tiles of fp32 [M, K]: (q [M, K], scale_inv [ceil(M/128), ceil(K/128)])."""
    m, k = x2.shape
    mb, kb = -(-m // BLOCK), -(-k // BLOCK)
    pad = torch.zeros(mb * BLOCK, kb * BLOCK)
    pad[:m, :k] = x2
    tiles = pad.reshape(mb, BLOCK, kb, BLOCK)
    scale = scale_from_amax(nan_amax(tiles, (1, 3)), FP8_MAX[fp8_dtype], pow2, eps)  # [mb, kb]
    q = cast(tiles, scale[:, None, :, None], fp8_dtype).reshape(mb * BLOCK, kb * BLOCK)[:m, :k]
    return q, 1.0 / scale


def random_input(shape, dtype, seed=0) -> torch.Tensor:
    """Normal values over several decades, plus exact zeros and a few large outliers."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp(torch.randn(shape, generator=g) * 2)
    flat = x.view(-1)
    if flat.numel() > 4:
        flat[:: max(1, flat.numel() // 5)] = 0.0
        flat[1] = 300.0
    return x.to(dtype)


@pytest.fixture
def oracle():
    return types.SimpleNamespace(
        bits=bits,
        cast=cast,
        scale_from_amax=scale_from_amax,
        as_matrix=as_matrix,
        block_1d=block_1d,
        block_2d=block_2d,
        random_input=random_input,
        FP8_MAX=FP8_MAX,
        FLT_MAX=FLT_MAX,
        BLOCK=BLOCK,
    )
