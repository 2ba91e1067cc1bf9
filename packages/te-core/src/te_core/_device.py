"""Whether the CUDA backend can run here, asked once (the answer does not change in a process)."""

from __future__ import annotations

import functools


@functools.cache
def cuda_device_count() -> int:
    from te_core import _C

    return _C.cuda_device_count()
