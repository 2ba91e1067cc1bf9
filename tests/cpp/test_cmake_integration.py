"""An integrator's C program, built with CMake against the installed te-cpp-headers and te-core."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

APP = Path(__file__).parent / "quantize_app"

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake on PATH")


def test_find_package_builds_and_runs(tmp_path: Path) -> None:
    cmake_dir = subprocess.run(
        [sys.executable, "-m", "te_cpp_headers", "--cmakedir"], check=True, capture_output=True, text=True
    ).stdout.strip()
    assert (Path(cmake_dir) / "TECoreConfig.cmake").is_file()
    build = tmp_path / "build"
    subprocess.run(
        [
            "cmake",
            "-S",
            str(APP),
            "-B",
            str(build),
            f"-DTECore_DIR={cmake_dir}",
            f"-DPython3_EXECUTABLE={sys.executable}",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    subprocess.run(["cmake", "--build", str(build)], check=True, capture_output=True, text=True)
    run = subprocess.run([str(build / "quantize_app")], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip() == "te quantize_app: ok"


def test_python_helpers_point_at_the_headers() -> None:
    import te_cpp_headers

    assert (Path(te_cpp_headers.get_include()) / "te" / "te.h").is_file()
    include = subprocess.run(
        [sys.executable, "-m", "te_cpp_headers", "--includedir"], check=True, capture_output=True, text=True
    ).stdout.strip()
    assert Path(include).resolve() == Path(te_cpp_headers.get_include()).resolve()
