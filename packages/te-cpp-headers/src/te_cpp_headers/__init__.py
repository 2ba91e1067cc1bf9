"""te-cpp-headers: te's C API headers and the CMake package config for integrators.

``find_package(TECore CONFIG)`` with ``-DTECore_DIR=$(python -m te_cpp_headers --cmakedir)``
gives the imported target ``TECore::te_core`` (headers + the libte_core.so of the installed
te-core wheel).
"""

from __future__ import annotations

import os

__version__ = "0.1.0"
__all__ = ["__version__", "get_include", "get_cmake_dir"]

_HERE = os.path.dirname(os.path.abspath(__file__))


def _first_existing(*candidates: str) -> str:
    for path in candidates:
        if os.path.isdir(path):
            return path
    raise FileNotFoundError(f"te-cpp-headers: none of {candidates} exists; reinstall te-cpp-headers")


def get_include() -> str:
    """Directory to put on the include path: it holds ``te/te.h``."""
    # Installed wheel first; the source tree (packages/te-cpp-headers/include) when run in place.
    return _first_existing(os.path.join(_HERE, "include"), os.path.join(_HERE, "..", "..", "include"))


def get_cmake_dir() -> str:
    """Directory holding ``TECoreConfig.cmake`` (pass it as ``TECore_DIR``)."""
    return _first_existing(os.path.join(_HERE, "cmake"), os.path.join(_HERE, "..", "..", "cmake"))
