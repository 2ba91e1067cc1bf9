"""benchmarks/linear.py refuses a --rows that names no row before it needs a GPU, and every row
name it offers is one main() builds."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "linear.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_rows_matching_nothing_is_refused_with_the_row_names():
    r = run("--rows", "Blockwise")
    assert r.returncode == 2, r.stderr
    assert "--rows: 'Blockwise' is in no row's name; rows: te.Linear BF16, te DelayedScaling" in r.stderr


def test_te_rows_are_names_main_builds():
    tree = ast.parse(SCRIPT.read_text())
    rows = next(
        ast.literal_eval(n.value)
        for n in tree.body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "TE_ROWS"
    )
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    literals = {n.value for n in ast.walk(main) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    for name in rows:
        base = name.removesuffix(" + CUDA graphs")
        assert base in literals, f"{name!r}: main() builds no row of that name"
