"""ci/gpu.sh refuses a bad part, files given to a part other than tests, and a bad TE_GPU_JOBS,
with exit 2 and a message, before it builds anything (no GPU needed)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "ci" / "gpu.sh"


@pytest.mark.parametrize(
    ("args", "jobs", "message"),
    [
        (["benchmarks"], "1", "usage: ci/gpu.sh [all | bench | tests [FILE...] | cpu]; got 'benchmarks'"),
        (["bench", "tests/gpu/test_gemm.py"], "1", "only 'tests' takes files; got 'tests/gpu/test_gemm.py'"),
        (["tests"], "0", "TE_GPU_JOBS must be a positive integer; got '0'"),
        (["tests"], "two", "TE_GPU_JOBS must be a positive integer; got 'two'"),
    ],
    ids=["unknown part", "files to bench", "zero jobs", "jobs not a number"],
)
def test_bad_arguments_exit_2_with_a_message(args, jobs, message, tmp_path):
    env = dict(os.environ, TE_GPU_JOBS=jobs, TE_GPU_OUT=str(tmp_path))
    r = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr
    assert not any(tmp_path.iterdir()), "it started the run"
