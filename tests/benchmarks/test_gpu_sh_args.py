"""ci/gpu.sh refuses a bad part, names given to a part other than tests and bench, a bad
TE_GPU_JOBS or TE_GPU_WORKERS, and TE_GPU_WORKERS without pytest-xdist, with exit 2 and a message,
before it builds anything; stops with exit 3 before building on a card TE_GPU_CARD does not name;
runs only the benchmarks named (no GPU needed: fake python3 and nvidia-smi)."""

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
        (
            ["benchmarks"],
            "1",
            "usage: ci/gpu.sh [all | bench [NAME...] | tests [FILE...] | cpu]; got 'benchmarks'",
        ),
        (
            ["cpu", "tests/gpu/test_gemm.py"],
            "1",
            "only 'tests' and 'bench' take names; got 'tests/gpu/test_gemm.py'",
        ),
        (["tests"], "0", "TE_GPU_JOBS must be a positive integer; got '0'"),
        (["tests"], "two", "TE_GPU_JOBS must be a positive integer; got 'two'"),
    ],
    ids=["unknown part", "files to cpu", "zero jobs", "jobs not a number"],
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
    """A copy of ci/gpu.sh in a tree with two GPU test files and two benchmarks (and a private
    helper module), a build script that builds nothing, a python3 on PATH that logs its arguments
    (pytest's calls exit pytest_rc) and an nvidia-smi that names an H100."""
    tree = tmp_path / "tree"
    (tree / "ci").mkdir(parents=True)
    (tree / "ci" / "gpu.sh").write_text(SCRIPT.read_text())
    (tree / "ci" / "dev_build.sh").write_text("echo built\n")
    (tree / "tests" / "gpu").mkdir(parents=True)
    for name in ("test_a.py", "test_b.py"):
        (tree / "tests" / "gpu" / name).write_text("")
    (tree / "benchmarks").mkdir()
    for name in ("norm.py", "linear.py", "_rounds.py"):
        (tree / "benchmarks" / name).write_text("")
    log = tmp_path / "python3.log"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text(
        f'#!/usr/bin/env bash\necho "$*" >> {log}\n[ "$1 $2" = "-m pytest" ] && exit {pytest_rc}\nexit 0\n'
    )
    fake.chmod(0o755)
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/usr/bin/env bash\necho 'NVIDIA H100 80GB HBM3'\n")
    smi.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return tree, log, env


def _run_tree(tree: Path, out: Path, args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(tree / "ci" / "gpu.sh"), *args],
        capture_output=True,
        text=True,
        env=dict(os.environ, TE_GPU_OUT=str(out), **env),
        timeout=60,
        cwd=tree,
    )


@pytest.mark.parametrize("pytest_rc", [0, 1], ids=["passing", "failing"])
@pytest.mark.parametrize("workers", ["3", ""], ids=["workers", "file by file"])
def test_test_files_run_and_their_exit_status_is_kept(workers, pytest_rc, tmp_path):
    tree, log, env = _fake_tree(tmp_path, pytest_rc)
    env.update(TE_GPU_WORKERS=workers, TE_GPU_JOBS="2")
    out = tmp_path / "out"
    r = _run_tree(tree, out, ["tests"], env)
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


def test_bench_runs_only_the_benchmarks_named(tmp_path):
    tree, log, env = _fake_tree(tmp_path, 0)
    r = _run_tree(tree, tmp_path / "out", ["bench", "linear"], env)
    assert r.returncode == 0, r.stdout + r.stderr
    ran = [line.split()[0] for line in log.read_text().splitlines() if line.startswith("benchmarks/")]
    assert ran == ["benchmarks/linear.py"]


@pytest.mark.parametrize("name", ["attention", "_rounds"])
def test_bench_with_an_unknown_name_says_so_and_fails(name, tmp_path):
    tree, log, env = _fake_tree(tmp_path, 0)
    r = _run_tree(tree, tmp_path / "out", ["bench", name, "norm"], env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"no benchmark '{name}' (benchmarks/{name}.py)" in r.stdout
    ran = [line.split()[0] for line in log.read_text().splitlines() if line.startswith("benchmarks/")]
    assert ran == ["benchmarks/norm.py"]


@pytest.mark.parametrize(("card", "rc"), [("H200", 3), ("H100", 0)])
def test_card_other_than_te_gpu_card_stops_before_the_build(card, rc, tmp_path):
    tree, log, env = _fake_tree(tmp_path, 0)
    out = tmp_path / "out"
    r = _run_tree(tree, out, ["bench", "norm"], {**env, "TE_GPU_CARD": card})
    assert r.returncode == rc, r.stdout + r.stderr
    assert ("stopping before the build" in r.stdout) == (rc == 3)
    assert (out / "build.log").exists() == (rc == 0)
