"""ci/ab_trees.sh refuses missing arguments, a bad round count, a folder that is not a te source
tree and a benchmark a tree lacks, with exit 2 and a message, before it builds or runs anything.
One round on two trees runs the benchmark from each in turn, labelled A and B."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "ci" / "ab_trees.sh"


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, cwd=cwd, timeout=120)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((".", "."), "usage: ci/ab_trees.sh TREE_A TREE_B ROUNDS BENCHMARK"),
        ((".", ".", "0", "benchmarks/linear.py"), "ROUNDS must be a positive integer; got '0'"),
        ((".", "/", "1", "benchmarks/linear.py"), "'/' is not a te source tree"),
        ((".", ".", "1", "benchmarks/nothing.py"), "no 'benchmarks/nothing.py' in '.'"),
    ],
    ids=["too few", "zero rounds", "not a tree", "no such benchmark"],
)
def test_bad_arguments_exit_2_with_a_message(args, message):
    r = _run(*args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr
    assert "==" not in r.stdout, "it started the run"


def test_one_round_runs_each_tree_in_turn(tmp_path):
    # Two stand-in trees (a built te-core marker and a benchmark that prints its own tree),
    # so nothing is built: the alternation, labels and per-tree PYTHONPATH are what is checked.
    for name in ("a", "b"):
        tree = tmp_path / name
        (tree / "ci").mkdir(parents=True)
        (tree / "ci" / "dev_build.sh").write_text("exit 1\n")
        lib = tree / "packages" / "te-core" / "src" / "te_core"
        lib.mkdir(parents=True)
        (lib / "_C.so").write_text("")
        (tree / "bench.py").write_text(
            "import os, sys\nprint(os.environ['PYTHONPATH'].split(':')[0].split('/')[-4], sys.argv[1:])\n"
        )
    r = _run(str(tmp_path / "a"), str(tmp_path / "b"), "2", "bench.py", "--x", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [line for line in r.stdout.splitlines() if not line.startswith("==")]
    assert lines == ["A a ['--x']", "B b ['--x']", "A a ['--x']", "B b ['--x']"]
