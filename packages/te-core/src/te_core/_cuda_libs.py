"""Finds the CUDA libraries te-core opens at run time, with NVIDIA's cuda-pathfinder.

libte_core.so dlopens cuBLASLt itself (TE_CUBLASLT_PATH, a copy already loaded by torch or jax,
the nvidia-cublas wheel beside te_core, the system loader, /usr/local/cuda). cuda-pathfinder knows
more places (conda, CUDA_HOME, other wheel layouts), so when it is installed te_core asks it once
and hands the answer to the C side through TE_CUBLASLT_PATH.
"""

from __future__ import annotations

import os


def export_cublaslt_path() -> None:
    """Sets TE_CUBLASLT_PATH from cuda-pathfinder unless the user already set it."""
    if os.environ.get("TE_CUBLASLT_PATH"):
        return
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        path = load_nvidia_dynamic_lib("cublasLt").abs_path
    except Exception:  # not installed, or no cuBLASLt here: the C side says what it searched
        return
    if path:
        os.environ["TE_CUBLASLT_PATH"] = path
