"""``te.LayerNorm`` and ``te.RMSNorm``: TE's normalization modules over te's fused kernels.

Both normalize over the trailing ``normalized_shape`` dims of the input (viewed as [..., H],
H = prod(normalized_shape)) with fp32 statistics and math whatever the dtypes (te/normalization.h):

    LayerNorm  y = (x - mean) / sqrt(var + eps) * g + bias
    RMSNorm    y = x / sqrt(mean(x^2) + eps) * g

with g = weight, or 1 + weight when ``zero_centered_gamma`` (the weight then starts at zero).
The output has the input's dtype; it is never quantized (inside te.autocast as outside), as in
TE. Forward and backward are one te kernel each (te_torch._high_precision.NormFn).
"""

from __future__ import annotations

import math
import numbers

import torch

from te_torch._availability import default_device
from te_torch._high_precision import norm
from te_torch._module_base import FLOAT_DTYPES, DropsTeExtraState, check_eps, parameter

__all__ = ["LayerNorm", "RMSNorm"]


def _shape(owner: str, normalized_shape, hidden_size) -> tuple[int, ...]:
    if hidden_size is not None:  # TE's deprecated name
        if normalized_shape is not None:
            raise TypeError(f"{owner}: pass normalized_shape or hidden_size (deprecated), not both")
        normalized_shape = hidden_size
    if normalized_shape is None:
        raise TypeError(f"{owner}: missing normalized_shape (an int, or a tuple of ints)")
    if isinstance(normalized_shape, numbers.Integral) and not isinstance(normalized_shape, bool):
        shape = (int(normalized_shape),)
    else:
        try:
            shape = tuple(normalized_shape)
        except TypeError:
            shape = None
        if shape is not None and not all(
            isinstance(d, numbers.Integral) and not isinstance(d, bool) for d in shape
        ):
            shape = None
        if shape is None:
            raise TypeError(
                f"{owner}: normalized_shape: expected an int or a tuple of ints, got {normalized_shape!r}"
            )
        shape = tuple(int(d) for d in shape)
    if not shape or any(d < 1 for d in shape):
        raise ValueError(
            f"{owner}: normalized_shape: expected one or more sizes >= 1 (the trailing dims "
            f"normalized over), got {normalized_shape!r}"
        )
    return shape


class _Norm(DropsTeExtraState, torch.nn.Module):
    _rms = False

    def __init__(
        self,
        normalized_shape=None,
        eps: float = 1e-5,
        sequence_parallel: bool | None = None,
        params_dtype: torch.dtype | None = None,
        zero_centered_gamma: bool = False,
        hidden_size: int | None = None,
        device=None,
        dtype: torch.dtype | None = None,
        sm_margin=0,
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        self.normalized_shape = _shape(owner, normalized_shape, hidden_size)
        self.eps = check_eps(owner, eps)
        if params_dtype is not None:  # TE's deprecated name
            if dtype is not None and dtype != params_dtype:
                raise TypeError(
                    f"{owner}: dtype={dtype} and params_dtype={params_dtype} disagree; pass dtype"
                )
            dtype = params_dtype
        dtype = torch.get_default_dtype() if dtype is None else dtype
        if dtype not in FLOAT_DTYPES:
            raise TypeError(f"{owner}: dtype: expected float32, bfloat16 or float16, got {dtype}")
        if not isinstance(sm_margin, (int, dict)) or isinstance(sm_margin, bool):
            raise TypeError(
                f"{owner}: sm_margin: expected an int or a dict {{'forward', 'backward', "
                f"'inference'}} -> int, got {sm_margin!r}"
            )
        self.sm_margin = sm_margin
        self.zero_centered_gamma = bool(zero_centered_gamma)
        self.sequence_parallel = bool(sequence_parallel)
        self._hidden = math.prod(self.normalized_shape)
        device = default_device() if device is None else torch.device(device)
        self.weight = torch.nn.Parameter(torch.empty(self.normalized_shape, dtype=dtype, device=device))
        if self._rms:
            self.bias = None
        else:
            self.bias = torch.nn.Parameter(torch.empty(self.normalized_shape, dtype=dtype, device=device))
        for p in self.parameters():
            # TE marks the parameters of a sequence-parallel norm for Megatron's gradient
            # all-reduce; the module itself does no communication.
            p.sequence_parallel = self.sequence_parallel
        self.reset_parameters()

    def reset_parameters(self, defer_init: bool = False) -> None:
        """weight ones (zeros with zero_centered_gamma), bias zeros."""
        if defer_init or self.weight.device.type == "meta":
            return
        with torch.no_grad():
            self.weight.fill_(0.0 if self.zero_centered_gamma else 1.0)
            if self.bias is not None:
                self.bias.zero_()

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, zero_centered_gamma={self.zero_centered_gamma}"

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        """Normalizes ``inp`` [..., *normalized_shape]; returns the same shape and dtype."""
        n = len(self.normalized_shape)
        if (
            not isinstance(inp, torch.Tensor)
            or inp.dtype not in FLOAT_DTYPES
            or tuple(inp.shape[inp.dim() - n :]) != self.normalized_shape
        ):
            self._bad_input(inp)
        weight, bias = parameter(self, "weight"), parameter(self, "bias")
        if n == 1:
            return norm(inp, weight, bias, self._rms, self.eps, self.zero_centered_gamma)
        x = inp.reshape(*inp.shape[: inp.dim() - n], self._hidden)
        w = weight.reshape(self._hidden)
        b = None if bias is None else bias.reshape(self._hidden)
        return norm(x, w, b, self._rms, self.eps, self.zero_centered_gamma).view(inp.shape)

    def _bad_input(self, inp) -> None:
        owner = type(self).__name__
        if not isinstance(inp, torch.Tensor):
            raise TypeError(f"{owner}: inp: expected a torch.Tensor, got {type(inp).__name__}")
        if inp.dtype not in FLOAT_DTYPES:
            raise TypeError(
                f"{owner}: inp: expected float32, bfloat16 or float16, got {inp.dtype}; cast it, "
                "e.g. inp.to(torch.bfloat16)"
            )
        raise ValueError(
            f"{owner}: inp: expected the trailing dims to be normalized_shape="
            f"{list(self.normalized_shape)}, got shape {tuple(inp.shape)}"
        )


class LayerNorm(_Norm):
    """TE's ``LayerNorm``: ``(x - mean) / sqrt(var + eps) * weight + bias`` over the trailing
    ``normalized_shape`` dims of x.

    Args:
        normalized_shape: an int H or a tuple of the trailing dims (TE's ``hidden_size`` is the
            deprecated spelling). Parameters ``weight`` and ``bias`` have this shape.
        eps: added to the variance (default 1e-5, TE's).
        zero_centered_gamma: the applied scale is ``1 + weight`` and ``weight`` starts at 0
            (weight decay then pulls the scale toward 1).
        device: default CUDA when te can run there, else CPU. dtype: the parameters' dtype
            (default torch.get_default_dtype(); ``params_dtype`` is TE's deprecated spelling).
            Input, output and parameters may have different float dtypes.
        sequence_parallel: sets ``p.sequence_parallel`` on the parameters (Megatron's marker
            for gradients to all-reduce), as TE; no communication happens here.
        sm_margin: TE's CUDA-kernel SM reservation (int or dict); accepted, has no effect in te.
    """


class RMSNorm(_Norm):
    """TE's ``RMSNorm``: ``x / sqrt(mean(x^2) + eps) * weight`` over the trailing
    ``normalized_shape`` dims of x. Arguments as ``LayerNorm`` (no bias)."""

    _rms = True
