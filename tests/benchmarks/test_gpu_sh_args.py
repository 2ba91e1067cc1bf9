"""ci/gpu.sh refuses a bad part, files given to a part other than tests, a bad TE_GPU_JOBS or
TE_GPU_WORKERS, and TE_GPU_WORKERS without pytest-xdist, with exit 2 and a message, before it
builds anything (no GPU needed)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "ci" / "gpu.sh"


def _run(args, tmp_path, **env):
    env = dict(os.environ, TE_GPU_OUT=str(tmp_path), **env)
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60)


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
    r = _run(args, tmp_path, TE_GPU_JOBS=jobs)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr
    assert not any(tmp_path.iterdir()), "it started the run"


@pytest.mark.parametrize("workers", ["0", "-3", "many"])
def test_bad_worker_count_exits_2(workers, tmp_path):
    r = _run(["tests"], tmp_path, TE_GPU_WORKERS=workers)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"TE_GPU_WORKERS must be a positive integer; got '{workers}'" in r.stderr
    assert not any(tmp_path.iterdir()), "it started the run"


def test_workers_without_xdist_exit_2(tmp_path):
    # An xdist package that fails to import stands in for a machine without pytest-xdist.
    out = tmp_path / "out"
    out.mkdir()
    fake = tmp_path / "fake" / "xdist"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no xdist here')\n")
    r = _run(["tests"], out, TE_GPU_WORKERS="4", PYTHONPATH=str(tmp_path / "fake"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "TE_GPU_WORKERS needs pytest-xdist" in r.stderr
    assert not any(out.iterdir()), "it started the run"
