"""``autograd.Function.apply`` without its Python wrapper, for te modules' eager FP8 steps.

torch's ``Function.apply`` is a Python classmethod around the C entry point: it checks for a
``setup_context``, asks whether functorch transforms are active and unwraps dead functorch
wrappers among the arguments, ~4 us per call on the CPU (a small Linear step's whole te-side
Python is ~150 us on the H200 host). te's Functions define no ``setup_context``, so eagerly and
outside functorch transforms the C entry point does the same work. Traced (torch.compile) or under
a transform, the wrapper is needed and used. A dead functorch wrapper (a tensor that escaped a
finished transform) fails in te's forward either way: it has no storage to quantize.
"""

from __future__ import annotations

import torch

transforms_active = torch._C._are_functorch_transforms_active
_is_compiling = torch.compiler.is_compiling


def raw_apply(fn_cls: type[torch.autograd.Function]):
    """``fn_cls``'s C-level apply (call it only where ``wrapper_needed()`` is False)."""
    return torch._C._FunctionBase.__dict__["apply"].__get__(None, fn_cls)


def wrapper_needed() -> bool:
    """Whether ``Function.apply``'s Python wrapper must run (tracing, or functorch transforms)."""
    return _is_compiling() or transforms_active()
