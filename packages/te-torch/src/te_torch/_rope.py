"""Rotary position embedding (RoPE): TE's ``RotaryPositionEmbedding`` and ``apply_rotary_pos_emb``.

``RotaryPositionEmbedding(dim)(s)`` gives the angles ``freqs`` [s, 1, 1, d] (fp32, d = dim *
rotary_percent): position p times inv_freq[i] = rotary_base ** (-2 i / d), the d / 2 angles
written twice, as [a, a] (``interleaved=False``) or [a0, a0, a1, a1, ...] (``interleaved=True``).
``apply_rotary_pos_emb(t, freqs)`` rotates the first d channels of each head of t by them and
passes the rest through:

    out = t * cos(freqs) + rotate(t) * sin(freqs)

with rotate(t) = [-t2, t1] for t = [t1, t2] (halves) or, interleaved, each pair (x, y) -> (-y, x).
The rotation runs in fp32 and is rounded to t's dtype once (TE's fused kernel; its unfused path
rounds after each product in t's dtype).
"""

from __future__ import annotations

import numbers

import torch

from te_torch._availability import default_device
from te_torch._module_base import FLOAT_DTYPES

__all__ = ["RotaryPositionEmbedding", "apply_rotary_pos_emb"]

TENSOR_FORMATS = ("sbhd", "bshd", "thd")


def _positive(owner: str, arg: str, v, allow_none: bool = False) -> float | None:
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not (0 < v < float("inf")):
        raise ValueError(f"{owner}: {arg}: expected a finite number > 0, got {v!r}")
    return float(v)


class RotaryPositionEmbedding(torch.nn.Module):
    """The angles of rotary position embedding (TE's module of the same name).

    Args:
        dim: the head dimension the angles are for; ``dim * rotary_percent`` channels rotate (an
            even count).
        rotary_percent: the fraction of the head dimension that rotates, in (0, 1].
        seq_len_interpolation_factor, pretrained_max_position_embeddings: both given, positions
            are divided by the factor (linear position interpolation), and sequences longer than
            their product are squeezed into the pretrained range instead (dynamic scaling); one
            alone changes nothing, as in TE.
        rotary_base: the base of the inverse frequencies (10000).
        interleaved: angles laid out per channel pair, for ``apply_rotary_pos_emb(...,
            interleaved=True)``.
        device: where the ``inv_freq`` buffer lives (default: CUDA when te can run there).

    ``forward(max_seq_len, offset=0)`` returns freqs [max_seq_len, 1, 1, d] fp32 for positions
    offset, ..., offset + max_seq_len - 1.
    """

    def __init__(
        self,
        dim: int,
        rotary_percent: float = 1.0,
        seq_len_interpolation_factor: float | None = None,
        pretrained_max_position_embeddings: int | None = None,
        rotary_base: float = 10000.0,
        interleaved: bool = False,
        device=None,
    ) -> None:
        super().__init__()
        owner = "RotaryPositionEmbedding"
        if isinstance(dim, bool) or not isinstance(dim, numbers.Integral) or dim < 2:
            raise ValueError(f"{owner}: dim: expected an int >= 2, got {dim!r}")
        if (
            isinstance(rotary_percent, bool)
            or not isinstance(rotary_percent, numbers.Real)
            or not (0 < rotary_percent <= 1)
        ):
            raise ValueError(f"{owner}: rotary_percent: expected a number in (0, 1], got {rotary_percent!r}")
        rot = int(dim * rotary_percent)
        if rot < 2 or rot % 2:
            raise ValueError(
                f"{owner}: dim * rotary_percent = {dim} * {rotary_percent} gives {rot} rotated "
                "channels: expected an even count >= 2"
            )
        self.seq_len_interpolation_factor = _positive(
            owner, "seq_len_interpolation_factor", seq_len_interpolation_factor, allow_none=True
        )
        if pretrained_max_position_embeddings is not None and (
            isinstance(pretrained_max_position_embeddings, bool)
            or not isinstance(pretrained_max_position_embeddings, numbers.Integral)
            or pretrained_max_position_embeddings < 1
        ):
            raise ValueError(
                f"{owner}: pretrained_max_position_embeddings: expected None or an int >= 1, got "
                f"{pretrained_max_position_embeddings!r}"
            )
        self.pretrained_max_position_embeddings = pretrained_max_position_embeddings
        self.rotary_base = _positive(owner, "rotary_base", rotary_base)
        self.interleaved = bool(interleaved)
        dev = default_device() if device is None else torch.device(device)
        exponent = torch.arange(0, rot, 2, dtype=torch.float32, device=dev) / rot
        # A persistent buffer, as TE's: its checkpoints hold inv_freq and load strictly here.
        self.register_buffer("inv_freq", 1.0 / (self.rotary_base**exponent))

    def forward(self, max_seq_len: int, offset: int = 0) -> torch.Tensor:
        for arg, v, low in (("max_seq_len", max_seq_len, 1), ("offset", offset, 0)):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < low:
                raise ValueError(
                    f"RotaryPositionEmbedding.forward: {arg}: expected an int >= {low}, got {v!r}"
                )
        pos = torch.arange(max_seq_len, dtype=torch.float32, device=self.inv_freq.device) + offset
        factor, pretrained = self.seq_len_interpolation_factor, self.pretrained_max_position_embeddings
        # TE scales positions only when both are given; a checkpoint trained with TE's angles
        # needs the same here.
        if factor is not None and pretrained is not None:
            if max_seq_len > pretrained * factor:
                pos = pos * (pretrained / max_seq_len)
            else:
                pos = pos / factor
        angles = torch.outer(pos, self.inv_freq)
        if self.interleaved:
            emb = angles.repeat_interleave(2, dim=-1)
        else:
            emb = torch.cat((angles, angles), dim=-1)
        return emb.view(max_seq_len, 1, 1, emb.shape[-1])


def _rotate(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    if interleaved:
        pairs = x.unflatten(-1, (-1, 2))
        return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _positions_thd(cu_seqlens: torch.Tensor, t: int, start_positions: torch.Tensor | None) -> torch.Tensor:
    """Each packed token's position inside its sequence (token j of sequence i is at j -
    cu_seqlens[i], plus start_positions[i]); tokens past cu_seqlens[-1] get positions past their
    last sequence's end."""
    tok = torch.arange(t, device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    seq = torch.searchsorted(cu_seqlens[1:].contiguous(), tok, right=True).clamp(max=cu_seqlens.numel() - 2)
    pos = (tok - cu_seqlens[seq]).long()
    if start_positions is not None:
        pos = pos + start_positions.to(pos.device).long()[seq]
    return pos


def apply_rotary_pos_emb(
    t: torch.Tensor,
    freqs: torch.Tensor,
    tensor_format: str = "sbhd",
    start_positions: torch.Tensor | None = None,
    interleaved: bool = False,
    fused: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    cp_size: int = 1,
    cp_rank: int = 0,
) -> torch.Tensor:
    """Rotates the first d channels of every head of ``t`` by the angles ``freqs`` (TE's function).

    Args:
        t: [s, b, h, D] (``"sbhd"``), [b, s, h, D] (``"bshd"``) or packed sequences [T, h, D]
            (``"thd"``, with ``cu_seqlens``); fp32, bf16 or fp16.
        freqs: [S, 1, 1, d] angles (RotaryPositionEmbedding's output), S >= the positions used,
            d <= D and even; the channels past d are passed through.
        start_positions: int [b], each sequence's first position (a KV-cache step); default 0.
        interleaved: the angles rotate channel pairs (2i, 2i + 1) instead of halves.
        fused: accepted (TE's fused kernel): te computes the same way either way.
        cu_seqlens: int32 [b + 1] sequence boundaries of a ``"thd"`` t; positions restart at 0 in
            each sequence.
        cp_size, cp_rank: context parallelism (its load-balanced positions); te has no context
            parallelism yet: cp_size must be 1.

    Returns:
        A tensor like ``t`` (same shape and dtype).
    """
    del fused
    return _apply(t, freqs, tensor_format, start_positions, interleaved, cu_seqlens, cp_size, cp_rank, True)


def apply_cached(t, freqs, tensor_format, start_positions, interleaved, cu_seqlens) -> torch.Tensor:
    """apply_rotary_pos_emb for a KV-cache step whose caller checked on the host that the
    sequences' positions fit freqs: no range check (no host sync a layer); padded positions
    past freqs take its last angle (their outputs are masked out)."""
    return _apply(t, freqs, tensor_format, start_positions, interleaved, cu_seqlens, 1, 0, False)


def _apply(t, freqs, tensor_format, start_positions, interleaved, cu_seqlens, cp_size, cp_rank, check):
    owner = "apply_rotary_pos_emb"
    if tensor_format not in TENSOR_FORMATS:
        raise ValueError(f"{owner}: tensor_format: expected one of {TENSOR_FORMATS}, got {tensor_format!r}")
    if cp_size != 1 or cp_rank != 0:
        raise NotImplementedError(
            f"{owner}: cp_size={cp_size!r}: context parallelism is not implemented in te yet"
        )
    ndim = 3 if tensor_format == "thd" else 4
    if not isinstance(t, torch.Tensor) or t.dim() != ndim or t.dtype not in FLOAT_DTYPES:
        raise ValueError(
            f"{owner}: t: expected a {ndim}-d fp32/bf16/fp16 tensor laid out {tensor_format}, got "
            f"{type(t).__name__ if not isinstance(t, torch.Tensor) else f'{t.dtype} {tuple(t.shape)}'}"
        )
    if not isinstance(freqs, torch.Tensor) or freqs.dim() != 4 or freqs.shape[1:3] != (1, 1):
        raise ValueError(
            f"{owner}: freqs: expected [S, 1, 1, d] angles (RotaryPositionEmbedding's output), got "
            f"{tuple(freqs.shape) if isinstance(freqs, torch.Tensor) else type(freqs).__name__}"
        )
    d = freqs.shape[-1]
    if d % 2 or d > t.shape[-1]:
        raise ValueError(f"{owner}: freqs: expected an even last dim <= t's head dim {t.shape[-1]}, got {d}")
    if freqs.device != t.device:
        raise ValueError(f"{owner}: freqs: expected it on t's device {t.device}, got {freqs.device}")
    angles = freqs.view(freqs.shape[0], d).float()
    if tensor_format == "thd":
        if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
            raise ValueError(f"{owner}: cu_seqlens: expected an int [b + 1] tensor with tensor_format='thd'")
        b = cu_seqlens.numel() - 1
        if start_positions is not None and (
            not isinstance(start_positions, torch.Tensor) or start_positions.shape != (b,)
        ):
            raise ValueError(f"{owner}: start_positions: expected an int tensor [b={b}] (cu_seqlens' b)")
        cu = cu_seqlens.to(t.device)
        pos = _positions_thd(cu, t.shape[0], start_positions)
        if check and start_positions is not None:
            # A KV-cache step's one host sync (as bshd's): a real token past freqs must not go
            # unrotated.
            real = torch.arange(t.shape[0], device=t.device) < cu[-1]
            top, low = int(torch.where(real, pos, 0).max()), int(torch.where(real, pos, 0).min())
            if top >= angles.shape[0] or low < 0:
                raise ValueError(
                    f"{owner}: start_positions: positions up to {top} need freqs of that length, got "
                    f"{angles.shape[0]}"
                )
        # Tokens past the last boundary (padding) may point past freqs: they are not rotated.
        inside = pos < angles.shape[0]
        a = angles[pos.clamp(max=angles.shape[0] - 1)] * inside[:, None]
        a = a[:, None, :]
    else:
        s_dim, b_dim = (0, 1) if tensor_format == "sbhd" else (1, 0)
        s, b = t.shape[s_dim], t.shape[b_dim]
        if start_positions is None:
            if s > angles.shape[0]:
                raise ValueError(f"{owner}: freqs: {angles.shape[0]} positions, t has a sequence of {s}")
            a = angles[:s][:, None, None, :]  # [s, 1, 1, d]
        else:
            if not isinstance(start_positions, torch.Tensor) or start_positions.shape != (b,):
                raise ValueError(f"{owner}: start_positions: expected an int tensor [b={b}]")
            pos = torch.arange(s, device=t.device)[:, None] + start_positions.to(t.device).long()[None, :]
            # The only host sync here, and only for a KV-cache step: an index past freqs would
            # otherwise fault on the GPU.
            if check and (int(pos.max()) >= angles.shape[0] or int(pos.min()) < 0):
                raise ValueError(
                    f"{owner}: start_positions: positions up to {int(pos.max())} need freqs of that "
                    f"length, got {angles.shape[0]}"
                )
            a = angles[pos.clamp(max=angles.shape[0] - 1)][:, :, None, :]  # [s, b, 1, d]
        if tensor_format == "bshd":
            a = a.transpose(0, 1)
    x = t[..., :d].float()
    out = (x * torch.cos(a) + _rotate(x, interleaved) * torch.sin(a)).to(t.dtype)
    if d == t.shape[-1]:
        return out
    return torch.cat((out, t[..., d:]), dim=-1)
