"""Transformer Engine's ``_extra_state`` read into te's, so a TE checkpoint loads into te's modules
with its DelayedScaling state.

TE 2.x saves a module's FP8 metadata as a uint8 tensor holding ``pickle.dumps(state)``: None for a
module that never ran in FP8, else a dict with TE's recipe object, ``extra_fp8_variables`` (plain
values) and, under DelayedScaling, ``scale_fwd`` / ``amax_history_fwd`` ([L, 3 n]) and
``scale_bwd`` / ``amax_history_bwd`` ([L, 2 n]) for a module of n GEMMs, GEMM k's roles in columns
3k..3k+2 (input, weight, output) and 2k..2k+1 (grad_output, grad_input): te's own layout, GEMM by
GEMM. Unpickling runs code named by the data, so this reader allows only what that format holds:
torch's tensor rebuild (its storage read by ``torch.load(weights_only=True)``), OrderedDict, and
TE's own classes (recipe, enums), which become inert records; any other global is refused before
it is called.
"""

from __future__ import annotations

import collections
import copyreg
import io
import pickle

import torch
import torch._utils

__all__ = ["is_te_extra_state", "read_te_extra_state"]

_KEYS = {  # TE's key -> (te's key, roles per GEMM)
    "amax_history_fwd": ("fwd_amax_history", 3),
    "scale_fwd": ("fwd_scale", 3),
    "amax_history_bwd": ("bwd_amax_history", 2),
    "scale_bwd": ("bwd_scale", 2),
}


class _TERecord:
    """A Transformer Engine object of the checkpoint (its recipe, an enum member): its arguments
    and state kept as data, no TE code run."""

    def __init__(self, *args, **kwargs) -> None:
        self.args, self.kwargs = args, kwargs

    def __setstate__(self, state) -> None:
        self.state = state


def _storage_from_bytes(data: bytes):
    return torch.load(io.BytesIO(data), weights_only=True)


class _Refused(pickle.UnpicklingError):
    """A global the checkpoint names that te does not load."""


class _Unpickler(pickle.Unpickler):
    _ALLOWED = {
        ("torch._utils", "_rebuild_tensor_v2"): torch._utils._rebuild_tensor_v2,
        ("torch.storage", "_load_from_bytes"): _storage_from_bytes,
        ("collections", "OrderedDict"): collections.OrderedDict,
        ("copyreg", "_reconstructor"): copyreg._reconstructor,
    }

    def find_class(self, module: str, name: str):
        found = self._ALLOWED.get((module, name))
        if found is not None:
            return found
        if module == "transformer_engine" or module.startswith("transformer_engine."):
            return type(name, (_TERecord,), {"__module__": "te_torch._te_extra_state.te"})
        raise _Refused(f"{module}.{name}")


def is_te_extra_state(state) -> bool:
    """Whether ``state`` has the form of TE 2.x's ``_extra_state``: a 1-D uint8 tensor."""
    return isinstance(state, torch.Tensor) and state.dtype == torch.uint8 and state.dim() == 1


def read_te_extra_state(state: torch.Tensor, n_gemms: int, owner: str) -> list[dict]:
    """TE's ``_extra_state`` as te's per-GEMM dicts (_gemm_state.EXTRA_KEYS), in TE's GEMM order;
    empty dicts where TE kept no DelayedScaling state (a module that never ran in FP8, or ran under
    a stateless recipe)."""
    what = f"{owner}: _extra_state (a Transformer Engine checkpoint's FP8 metadata)"
    if state.numel() == 0:
        return [{} for _ in range(n_gemms)]
    try:
        data = _Unpickler(io.BytesIO(state.detach().cpu().numpy().tobytes())).load()
    except _Refused as e:
        raise ValueError(
            f"{what}: it names {e}, which te does not load (only tensors and TE's own recipe objects); "
            "drop the _extra_state keys to start from fresh scales"
        ) from None
    except Exception as e:  # noqa: BLE001 - truncated or foreign bytes: say which, not pickle's internals
        raise ValueError(
            f"{what}: not a pickle te can read ({type(e).__name__}: {e}); drop the _extra_state keys "
            "to start from fresh scales"
        ) from None
    if data is None or (isinstance(data, dict) and "amax_history_fwd" not in data):
        return [{} for _ in range(n_gemms)]
    if not isinstance(data, dict):
        raise ValueError(f"{what}: expected a dict or None, got {type(data).__name__}")
    out = [{} for _ in range(n_gemms)]
    for te_key, (key, roles) in _KEYS.items():
        t = data.get(te_key)
        cols = roles * n_gemms
        if not isinstance(t, torch.Tensor) or t.shape[-1:] != (cols,):
            got = f"{t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(
                f"{what}[{te_key!r}]: expected a tensor with {cols} columns ({roles} for each of this "
                f"module's {n_gemms} GEMM(s)), got {got}: a checkpoint of another kind of module?"
            )
        for k in range(n_gemms):
            out[k][key] = t[..., k * roles : (k + 1) * roles].float()
    return out
