"""Hatchling build hook: compiles te-core's CMake project and puts its binaries in the wheel.

Environment: TE_CUDA_ARCHS (semicolon list, e.g. "90a"; empty for a CPU-only build; default the
fat build in CMakeLists.txt), TE_BUILD_JOBS (parallel compile jobs, default all cores),
TE_BUILD_DIR (CMake build directory, default build/<python tag> under this package).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class CMakeBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel":
            return
        import pybind11

        root = Path(self.root)
        tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
        build_dir = Path(os.environ.get("TE_BUILD_DIR", root / "build" / tag))
        stage = build_dir / "stage"
        configure = [
            "cmake",
            "-S",
            str(root),
            "-B",
            str(build_dir),
            "-G",
            "Ninja",
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
            f"-DCMAKE_INSTALL_PREFIX={stage}",
        ]
        sdist_headers = root / "te-headers"
        if not (root.parent / "te-cpp-headers" / "include" / "te" / "te.h").exists():
            configure.append(f"-DTE_HEADERS_DIR={sdist_headers}")
        jobs = os.environ.get("TE_BUILD_JOBS", str(os.cpu_count() or 1))
        subprocess.run(configure, check=True)
        subprocess.run(["cmake", "--build", str(build_dir), "-j", jobs], check=True)
        subprocess.run(["cmake", "--install", str(build_dir)], check=True)

        package = stage / "te_core"
        for path in package.rglob("*"):
            if path.is_file():
                build_data["force_include"][str(path)] = f"te_core/{path.relative_to(package)}"
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
