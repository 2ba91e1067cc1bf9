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


def _fake_tree(tmp_path: Path, pytest_rc: int) -> tuple[Path, Path, dict]:
    """A copy of ci/gpu.sh in a tree with two GPU test files, a build script that builds
    nothing, and a python3 on PATH that logs its arguments (pytest's calls exit pytest_rc)."""
    tree = tmp_path / "tree"
    (tree / "ci").mkdir(parents=True)
    (tree / "ci" / "gpu.sh").write_text(SCRIPT.read_text())
    (tree / "ci" / "dev_build.sh").write_text("echo built\n")
    (tree / "tests" / "gpu").mkdir(parents=True)
    for name in ("test_a.py", "test_b.py"):
        (tree / "tests" / "gpu" / name).write_text("")
    log = tmp_path / "python3.log"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text(
        f'#!/usr/bin/env bash\necho "$*" >> {log}\n[ "$1 $2" = "-m pytest" ] && exit {pytest_rc}\nexit 0\n'
    )
    fake.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return tree, log, env


@pytest.mark.parametrize("pytest_rc", [0, 1], ids=["passing", "failing"])
@pytest.mark.parametrize("workers", ["3", ""], ids=["workers", "file by file"])
def test_test_files_run_and_their_exit_status_is_kept(workers, pytest_rc, tmp_path):
    tree, log, env = _fake_tree(tmp_path, pytest_rc)
    env.update(TE_GPU_WORKERS=workers, TE_GPU_JOBS="2")
    out = tmp_path / "out"
    r = subprocess.run(
        ["bash", str(tree / "ci" / "gpu.sh"), "tests"],
        capture_output=True,
        text=True,
        env=dict(os.environ, TE_GPU_OUT=str(out), **env),
        timeout=60,
        cwd=tree,
    )
    runs = [line.split() for line in log.read_text().splitlines() if line.startswith("-m pytest")]
    if workers:  # one run over every file, on the workers
        assert len(runs) == 1, runs
        assert runs[0][runs[0].index("-n") + 1] == "3"
        assert "tests/gpu/test_a.py" in runs[0] and "tests/gpu/test_b.py" in runs[0]
        assert (out / "gpu_tests.rc").read_text().strip() == str(pytest_rc)
    else:  # a run per file
        assert sorted(a for run in runs for a in run if a.startswith("tests/")) == [
            "tests/gpu/test_a.py",
            "tests/gpu/test_b.py",
        ]
        assert all("-n" not in run for run in runs)
        assert (out / "test_a.rc").read_text().strip() == str(pytest_rc)
    assert r.returncode == pytest_rc, r.stdout + r.stderr
