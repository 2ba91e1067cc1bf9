"""te.RotaryPositionEmbedding and te.apply_rotary_pos_emb against an independent reference.

The angles are checked against the formula written out (position * base^(-2 i / d) in fp64, laid
out [a, a] or [a0, a0, a1, a1, ...]); the rotation against complex multiplication: channel pairs
(x_i, x_{i + d/2}) (or (x_{2i}, x_{2i+1}) interleaved) are the complex numbers x_i + i x_{i+d/2},
multiplied by exp(i * angle) in fp64. Channels past d pass through untouched.
"""

from __future__ import annotations

import math

import pytest
import te_torch as te
import torch

F32_TOL = {"atol": 1e-5, "rtol": 1e-5}


def pair_angles(positions, d, base=10000.0):
    """[len(positions), d / 2] fp64: position * base^(-2 i / d)."""
    return torch.tensor(
        [[p * base ** (-2.0 * i / d) for i in range(d // 2)] for p in positions], dtype=torch.float64
    )


def layout(angles, interleaved):
    """Pair angles [..., d / 2] -> TE's per-channel freqs [..., d]."""
    if interleaved:
        return torch.stack((angles, angles), dim=-1).flatten(-2)
    return torch.cat((angles, angles), dim=-1)


def rotate_ref(x, angles, interleaved):
    """x [..., D] rotated by pair angles [..., d / 2] (broadcast), as complex numbers, fp64."""
    x = x.double()
    d = 2 * angles.shape[-1]
    head, tail = x[..., :d], x[..., d:]
    re, im = (head[..., 0::2], head[..., 1::2]) if interleaved else (head[..., : d // 2], head[..., d // 2 :])
    z = torch.complex(re, im) * torch.polar(torch.ones_like(angles), angles.double())
    rot = (
        torch.stack((z.real, z.imag), dim=-1).flatten(-2)
        if interleaved
        else torch.cat((z.real, z.imag), dim=-1)
    )
    return torch.cat((rot, tail), dim=-1)


def rope(dim, **kw):
    kw.setdefault("device", "cpu")
    return te.RotaryPositionEmbedding(dim, **kw)


# ----------------------------------------------------------------------------------------------
# The angles
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dim, percent", [(8, 1.0), (64, 1.0), (16, 0.5), (24, 0.25)])
@pytest.mark.parametrize("base", [10000.0, 500.0])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("offset", [0, 7])
def test_angles_follow_the_formula(dim, percent, base, interleaved, offset):
    s = 12
    m = rope(dim, rotary_percent=percent, rotary_base=base, interleaved=interleaved)
    freqs = m(s, offset=offset)
    d = int(dim * percent)
    assert freqs.shape == (s, 1, 1, d) and freqs.dtype == torch.float32
    want = layout(pair_angles(range(offset, offset + s), d, base), interleaved)
    torch.testing.assert_close(freqs.view(s, d).double(), want, atol=1e-6, rtol=2e-6)


def test_rotary_percent_truncates_like_te():
    """16 * 0.3 = 4.8 -> 4 rotated channels (TE's int(dim * rotary_percent)), base over those 4."""
    freqs = rope(16, rotary_percent=0.3)(3)
    torch.testing.assert_close(
        freqs.view(3, 4).double(), layout(pair_angles(range(3), 4), False), atol=1e-6, rtol=2e-6
    )


def test_angle_layouts_side_by_side():
    a = rope(8)(3)[:, 0, 0]
    b = rope(8, interleaved=True)(3)[:, 0, 0]
    p = pair_angles(range(3), 8).float()
    torch.testing.assert_close(a, torch.cat([p, p], -1))  # [a0 a1 a2 a3 a0 a1 a2 a3]
    torch.testing.assert_close(b, p[:, [0, 0, 1, 1, 2, 2, 3, 3]])  # [a0 a0 a1 a1 ...]


@pytest.mark.parametrize(
    "factor, pretrained, s, scale",
    [
        (2.0, None, 10, 1.0),  # the factor alone changes nothing (TE's rule: both or neither)
        (4.0, 16, 20, 1 / 4.0),  # within pretrained * factor = 64: / factor
        (2.0, 8, 20, 8 / 20),  # longer than 16: squeezed into the pretrained 8 (dynamic)
        (None, 8, 20, 1.0),  # pretrained alone changes nothing
    ],
)
def test_position_interpolation(factor, pretrained, s, scale):
    m = rope(16, seq_len_interpolation_factor=factor, pretrained_max_position_embeddings=pretrained)
    want = layout(pair_angles([p * scale for p in range(s)], 16), False)
    torch.testing.assert_close(m(s).view(s, 16).double(), want, atol=1e-6, rtol=2e-6)


def test_inv_freq_is_a_persistent_buffer():
    m = rope(16, rotary_percent=0.5, rotary_base=100.0)
    sd = m.state_dict()
    assert list(sd) == ["inv_freq"]
    torch.testing.assert_close(
        sd["inv_freq"].double(), torch.tensor([100.0 ** (-2 * i / 8) for i in range(4)], dtype=torch.float64)
    )
    other = rope(16, rotary_percent=0.5, rotary_base=100.0)
    other.load_state_dict(sd, strict=True)


# ----------------------------------------------------------------------------------------------
# The rotation
# ----------------------------------------------------------------------------------------------


def _apply_and_check(t, freqs_fn_angles, ref_angles, interleaved, tol=F32_TOL, **kw):
    """Module output and gradient against the complex reference for one random output gradient."""
    x = t.detach().clone().requires_grad_()
    xr = t.detach().double().requires_grad_()
    out = te.apply_rotary_pos_emb(x, freqs_fn_angles, interleaved=interleaved, **kw)
    ref = rotate_ref(xr, ref_angles, interleaved)
    assert out.shape == t.shape and out.dtype == t.dtype
    torch.testing.assert_close(out.double(), ref, **tol)
    dy = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    (out.double() * dy).sum().backward()
    (ref * dy).sum().backward()
    torch.testing.assert_close(x.grad.double(), xr.grad, **tol)
    # The rotation is orthogonal: the gradient keeps the output gradient's norm.
    assert math.isclose(x.grad.double().norm().item(), dy.norm().item(), rel_tol=1e-5)
    return out


@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("percent", [1.0, 0.5])
@pytest.mark.parametrize("fused", [False, True])
def test_apply_sbhd_bshd(fmt, interleaved, percent, fused):
    s, b, h, D = 6, 2, 3, 16
    d = int(D * percent)
    gen = torch.Generator().manual_seed(2)
    t = torch.randn((s, b, h, D) if fmt == "sbhd" else (b, s, h, D), generator=gen)
    freqs = rope(D, rotary_percent=percent, interleaved=interleaved)(s + 4)  # longer than s: first s used
    ang = pair_angles(range(s), d)  # [s, d / 2]
    ang = ang[:, None, None, :] if fmt == "sbhd" else ang[None, :, None, :]
    out = _apply_and_check(t, freqs, ang, interleaved, tensor_format=fmt, fused=fused)
    assert torch.equal(out[..., d:], t[..., d:])  # the tail passes through, bit for bit
    if fmt == "sbhd":
        assert torch.equal(out[0], t[0])  # position 0: angle 0


def test_apply_with_arbitrary_angles():
    """The rotation itself, with angles not from the module (large and negative ones too)."""
    s, b, h, d = 5, 2, 2, 8
    gen = torch.Generator().manual_seed(3)
    ang = (torch.rand(s, d // 2, generator=gen) - 0.5) * 40
    t = torch.randn(s, b, h, d, generator=gen)
    for interleaved in (False, True):
        freqs = layout(ang, interleaved).view(s, 1, 1, d)
        _apply_and_check(t, freqs, ang.double()[:, None, None, :], interleaved)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("percent", [1.0, 0.5])
def test_apply_thd_positions_restart_per_sequence(interleaved, percent):
    h, D = 2, 16
    d = int(D * percent)
    cu = torch.tensor([0, 3, 3, 8, 10], dtype=torch.int32)
    t = torch.randn(10, h, D, generator=torch.Generator().manual_seed(4))
    positions = [0, 1, 2, 0, 1, 2, 3, 4, 0, 1]
    freqs = rope(D, rotary_percent=percent, interleaved=interleaved)(6)
    ang = pair_angles(positions, d)[:, None, :]  # [t, 1, d / 2]
    out = _apply_and_check(t, freqs, ang, interleaved, tensor_format="thd", cu_seqlens=cu)
    assert torch.equal(out[[0, 3, 8]], t[[0, 3, 8]])  # each sequence's first token: angle 0


@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_start_positions(fmt, interleaved):
    """start_positions[i]: sequence i's first position (a KV-cache step)."""
    s, b, h, d = 3, 3, 2, 8
    start = torch.tensor([0, 2, 5])
    t = torch.randn(
        (s, b, h, d) if fmt == "sbhd" else (b, s, h, d), generator=torch.Generator().manual_seed(5)
    )
    freqs = rope(d, interleaved=interleaved)(8)
    ang = torch.stack([pair_angles(range(p, p + s), d) for p in start.tolist()], dim=1)  # [s, b, d / 2]
    ang = ang[:, :, None, :] if fmt == "sbhd" else ang.transpose(0, 1)[:, :, None, :]
    _apply_and_check(t, freqs, ang, interleaved, tensor_format=fmt, start_positions=start)
    _apply_and_check(t, freqs, ang, interleaved, tensor_format=fmt, start_positions=start.int())


def _ulp_bf16_fp16(r, dtype):
    """The spacing of ``dtype`` at |r| (fp32 tensor of values representable in dtype)."""
    mant = 7 if dtype == torch.bfloat16 else 10
    tiny = torch.finfo(dtype).smallest_normal
    e = torch.floor(torch.log2(r.abs().clamp(min=tiny)))
    return torch.pow(2.0, e - mant)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("fmt", ["sbhd", "thd"])
def test_low_precision_rounds_once(dtype, interleaved, fmt):
    """The rotation runs in fp32 and is rounded to t's dtype once: within 1 ulp of the exact
    result rounded to the dtype."""
    gen = torch.Generator().manual_seed(6)
    D, d = 32, 24
    if fmt == "sbhd":
        t = torch.randn(64, 2, 4, D, generator=gen).mul(3).to(dtype)
        ang = pair_angles(range(64), d)[:, None, None, :]
        kw = {}
    else:
        t = torch.randn(64, 4, D, generator=gen).mul(3).to(dtype)
        cu = torch.tensor([0, 30, 64], dtype=torch.int32)
        ang = pair_angles([*range(30), *range(34)], d)[:, None, :]
        kw = {"cu_seqlens": cu}
    freqs = rope(32, rotary_percent=0.75, interleaved=interleaved)(64)
    out = te.apply_rotary_pos_emb(t, freqs, tensor_format=fmt, interleaved=interleaved, **kw)
    assert out.dtype == dtype
    want = rotate_ref(t, ang, interleaved).to(dtype).float()
    diff = (out.float() - want).abs()
    assert (diff <= _ulp_bf16_fp16(want, dtype)).all(), diff.max()
    assert torch.equal(out[..., d:], t[..., d:])
    # A rotation done in fp32 before rounding: far closer than low precision products would be.
    assert (diff == 0).float().mean() > 0.9


# ----------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"dim": 7}, r"dim \* rotary_percent = 7 \* 1.0 gives 7 rotated channels: expected an even count"),
        ({"dim": 1}, r"dim: expected an int >= 2"),
        ({"dim": 16, "rotary_percent": 0.0}, r"rotary_percent: expected a number in \(0, 1\]"),
        ({"dim": 16, "rotary_percent": 1.5}, r"rotary_percent"),
        ({"dim": 16, "rotary_base": -1.0}, r"rotary_base: expected a finite number > 0"),
        ({"dim": 16, "seq_len_interpolation_factor": 0}, r"seq_len_interpolation_factor"),
        ({"dim": 16, "pretrained_max_position_embeddings": 0}, r"pretrained_max_position_embeddings"),
    ],
)
def test_constructor_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        rope(**kwargs)


def test_forward_errors():
    m = rope(8)
    with pytest.raises(ValueError, match=r"max_seq_len: expected an int >= 1"):
        m(0)
    with pytest.raises(ValueError, match=r"offset: expected an int >= 0"):
        m(4, offset=-1)


@pytest.mark.parametrize(
    "case, err, match",
    [
        ("odd_freqs", ValueError, r"freqs: expected an even last dim"),
        ("wide_freqs", ValueError, r"freqs: expected an even last dim <= t's head dim 8, got 10"),
        ("short_freqs", ValueError, r"freqs: 4 positions, t has a sequence of 6"),
        ("freqs_shape", ValueError, r"freqs: expected \[S, 1, 1, d\]"),
        ("format", ValueError, r"tensor_format: expected one of"),
        ("cp_size", NotImplementedError, r"cp_size=2"),
        ("t_ndim", ValueError, r"t: expected a 4-d"),
        ("t_int", ValueError, r"t: expected a 4-d fp32/bf16/fp16"),
        ("thd_no_cu", ValueError, r"cu_seqlens: expected an int \[b \+ 1\] tensor"),
        ("thd_start", ValueError, r"start_positions: expected an int tensor \[b=1\] \(cu_seqlens' b\)"),
        ("start_shape", ValueError, r"start_positions: expected an int tensor \[b=2\]"),
        ("start_past_freqs", ValueError, r"start_positions: positions up to 10"),
        ("start_negative", ValueError, r"start_positions"),
        ("freqs_device", ValueError, r"freqs: expected it on t's device"),
    ],
)
def test_apply_errors(case, err, match):
    t = torch.randn(6, 2, 2, 8)
    f = rope(8)(8)
    call = {
        "odd_freqs": lambda: te.apply_rotary_pos_emb(t, f[..., :5]),
        "wide_freqs": lambda: te.apply_rotary_pos_emb(t, torch.zeros(8, 1, 1, 10)),
        "short_freqs": lambda: te.apply_rotary_pos_emb(t, f[:4]),
        "freqs_shape": lambda: te.apply_rotary_pos_emb(t, f.view(8, 8)),
        "format": lambda: te.apply_rotary_pos_emb(t, f, tensor_format="bhsd"),
        "cp_size": lambda: te.apply_rotary_pos_emb(t, f, cp_size=2, cp_rank=0),
        "t_ndim": lambda: te.apply_rotary_pos_emb(t[0], f),
        "t_int": lambda: te.apply_rotary_pos_emb(t.long(), f),
        "thd_no_cu": lambda: te.apply_rotary_pos_emb(t[0], f, tensor_format="thd"),
        "thd_start": lambda: te.apply_rotary_pos_emb(
            t[0],
            f,
            tensor_format="thd",
            cu_seqlens=torch.tensor([0, 2], dtype=torch.int32),
            start_positions=torch.zeros(2),
        ),
        "start_shape": lambda: te.apply_rotary_pos_emb(
            t, f, start_positions=torch.zeros(3, dtype=torch.long)
        ),
        "start_past_freqs": lambda: te.apply_rotary_pos_emb(t, f, start_positions=torch.tensor([0, 5])),
        "start_negative": lambda: te.apply_rotary_pos_emb(t, f, start_positions=torch.tensor([0, -1])),
        "freqs_device": lambda: te.apply_rotary_pos_emb(t, f.to("meta")),
    }[case]
    with pytest.raises(err, match=match):
        call()
