"""benchmarks/jax_dense.py refuses a bad --b2b before it builds anything (no GPU needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "jax_dense.py"


@pytest.mark.parametrize("b2b", ["0", "-3"])
def test_b2b_below_one_is_refused_with_its_name(b2b):
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--b2b", b2b], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2, r.stderr
    assert f"--b2b: expected a step count >= 1, got {b2b}" in r.stderr
