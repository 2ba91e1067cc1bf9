"""te-core: te's C API (libte_core.so) for Python.

``te_core._C`` is the thin binding to the C API (raw pointers, shapes, dtype enums, streams);
``te_core.recipe`` holds the framework-free scaling recipes both te_torch and te_jax use.
Importing te_core needs no GPU and no CUDA library: the CUDA runtime is linked statically into
libte_core.so, the NVIDIA driver is opened when a CUDA tensor is first used, and cuBLASLt when the
first CUDA GEMM runs (located with cuda-pathfinder where it is installed). te-core's rare log
messages (a slower fallback taken, once per kind) go to Python's ``logging``, logger ``"te"``.
"""

from __future__ import annotations

import os

from te_core import recipe as recipe
from te_core._version import __version__ as __version__


def _connect_library() -> None:
    try:
        from te_core import _C
    except ImportError:  # a source tree without the compiled module (docs): nothing to locate
        return
    _C.forward_log_to_python()
    if _C.BUILT_WITH_CUDA:
        from te_core._cuda_libs import export_cublaslt_path

        export_cublaslt_path()


_connect_library()

__all__ = ["__version__", "recipe", "library_path", "cuda_available"]


def library_path() -> str:
    """Absolute path of the libte_core.so this package loads (for C/C++ integrators)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib", "libte_core.so")


def cuda_available() -> bool:
    """True when te-core was built with CUDA kernels and a CUDA device is usable here."""
    from te_core._device import cuda_device_count

    return cuda_device_count() > 0
