"""tests/gpu runs only where te's CUDA backend can: elsewhere every test here is skipped, and the
run says so in a banner rather than passing quietly."""

from __future__ import annotations

import os
import sys

import pytest

# Shared helpers beside the tests (_jax_devices.py); --import-mode=importlib does not add this
# folder to sys.path by itself.
_here = os.path.dirname(os.path.abspath(__file__))
if _here not in sys.path:
    sys.path.insert(0, _here)

_skipped: list[str] = []


def _gpu_reason() -> str | None:
    try:
        import te_core
        from te_core import _C
    except ImportError as e:
        return f"te_core is not importable ({e})"
    if not _C.BUILT_WITH_CUDA:
        return "te-core was built without CUDA (TE_CUDA_ARCHS empty)"
    if not te_core.cuda_available():
        return "no CUDA GPU or NVIDIA driver on this machine"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _gpu_reason()
    if reason is None:
        return
    marker = pytest.mark.skip(reason=f"GPU test: {reason}")
    for item in items:
        if "tests/gpu/" in str(item.path).replace("\\", "/"):
            item.add_marker(marker)
            _skipped.append(item.nodeid)
    if _skipped:
        _skipped.insert(0, reason)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if _skipped:
        reason, count = _skipped[0], len(_skipped) - 1
        terminalreporter.section("GPU TESTS NOT RUN", sep="!", bold=True, yellow=True)
        terminalreporter.line(f"{count} tests in tests/gpu were SKIPPED: {reason}.", yellow=True, bold=True)
        terminalreporter.line("They run on the GPU test machine through ci/gpu.sh (nox -s gpu).", yellow=True)
