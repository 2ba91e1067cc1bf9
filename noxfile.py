"""Every build, test, docs, lint and demo entry point of te (`nox -l` lists them).

The README's test command is `nox -s tests`: it builds te-core (CPU backend plus the CUDA kernels
for TE_CUDA_ARCHS, default 90a, so a CUDA compile error fails CI even without a GPU), builds the
other three wheels, installs all four into a fresh virtual environment and runs the suite.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import nox

ROOT = Path(__file__).parent
DIST = ROOT / "dist"
PACKAGES = ("te-cpp-headers", "te-core", "te-torch", "te-jax")
BUILD_DEPS = ("hatchling>=1.20", "cmake>=3.26", "ninja", "pybind11>=2.12", "jaxlib>=0.5")
# torch 2.13.0 is the CPU build CI machines carry on disk; other versions download CUDA wheels.
TORCH = os.environ.get("TE_TORCH_SPEC", "torch==2.13.0")
TEST_DEPS = ("pytest", "numpy", "ml_dtypes", "cuda-pathfinder", TORCH, "jax", "flax")
CUBLAS_HEADERS_WHEEL = "nvidia-cublas>=13,<14"
CPU_SUITE = ("tests/core", "tests/torch", "tests/jax", "tests/cpp", "tests/benchmarks", "tests/gpu")

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True


def _cublas_headers(session: nox.Session) -> str:
    """cublasLt.h for the CUDA build (te dlopens the library; only the header is compiled in):
    the toolkit's if it has one, else the include folder of the nvidia-cublas wheel, downloaded
    once and unpacked without installing its libraries."""
    if os.environ.get("TE_CUBLAS_INCLUDE_DIR"):
        return os.environ["TE_CUBLAS_INCLUDE_DIR"]
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    if (Path(cuda_home) / "include" / "cublasLt.h").exists():
        return ""
    cache = ROOT / ".nox" / "cublas-headers"
    include = cache / "nvidia" / "cu13" / "include"
    if not (include / "cublasLt.h").exists():
        session.run("python", "-m", "pip", "download", "--no-deps", "-d", str(cache), CUBLAS_HEADERS_WHEEL)
        (wheel,) = cache.glob("nvidia_cublas-*.whl")
        with zipfile.ZipFile(wheel) as z:
            z.extractall(cache, [n for n in z.namelist() if "/include/" in n])
        wheel.unlink()
    return str(include)


def _build_wheels(session: nox.Session) -> list[Path]:
    """Builds the four wheels into dist/ (no build isolation: the session holds the build deps)."""
    session.install(*BUILD_DEPS)
    DIST.mkdir(exist_ok=True)
    for old in DIST.glob("te_*.whl"):
        old.unlink()
    env = {"TE_CUDA_ARCHS": os.environ.get("TE_CUDA_ARCHS", "90a")}
    if env["TE_CUDA_ARCHS"]:
        env["TE_CUBLAS_INCLUDE_DIR"] = _cublas_headers(session)
    for package in PACKAGES:
        session.run(
            "python",
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(DIST),
            str(ROOT / "packages" / package),
            env=env,
        )
    return sorted(DIST.glob("te_*.whl"))


@nox.session
def build(session: nox.Session) -> None:
    """Four wheels into dist/: te-cpp-headers, te-core (CMake via hatchling), te-torch, te-jax."""
    wheels = _build_wheels(session)
    session.log("built: " + ", ".join(w.name for w in wheels))


@nox.session
def tests(session: nox.Session) -> None:
    """Builds and installs the four packages, then runs the CPU suite (GPU tests skip loudly)."""
    wheels = _build_wheels(session)
    session.install(*TEST_DEPS)
    session.install("--no-deps", "--force-reinstall", *map(str, wheels))
    session.run("python", "-m", "pytest", "-ra", *(session.posargs or CPU_SUITE))


@nox.session(venv_backend="none")
def gpu(session: nox.Session) -> None:
    """What ci/gpu.sh runs on the H200: GPU tests and benchmarks, results into $TE_GPU_OUT.
    ``nox -s gpu -- tests [FILE...]`` (or ``bench``, ``cpu``) runs one part of it."""
    session.run("bash", str(ROOT / "ci" / "gpu.sh"), *session.posargs, external=True)


@nox.session
def docs(session: nox.Session) -> None:
    """Sphinx site into docs/_build/html; warnings are errors."""
    session.install("sphinx")
    session.run("sphinx-build", "-W", "--keep-going", "-b", "html", "docs", "docs/_build/html")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over all Python."""
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def demo(session: nox.Session) -> None:
    """Trains a small GPT of te modules with BF16 and each FP8 recipe (table, loss-curve PNG and
    JSON into demo_out/; arguments after `--` go to examples/gpt/demo.py), then quantizes one
    tensor with every scheme and prints the error and speed of each."""
    wheels = _build_wheels(session)
    session.install("numpy", TORCH)
    session.install("--no-deps", "--force-reinstall", *map(str, wheels))
    session.run("python", str(ROOT / "examples" / "gpt" / "demo.py"), *session.posargs)
    session.run("python", str(ROOT / "examples" / "quantize_demo.py"))


@nox.session
def jax_example(session: nox.Session) -> None:
    """Trains a small MLP stack with te_jax.flax under each recipe (examples/flax_mlp.py)."""
    wheels = _build_wheels(session)
    session.install("numpy", "jax", "flax", "optax")
    session.install("--no-deps", "--force-reinstall", *(str(w) for w in wheels if "te_torch" not in w.name))
    session.run("python", str(ROOT / "examples" / "flax_mlp.py"), *session.posargs)
