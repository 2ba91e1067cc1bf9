"""benchmarks/activation.py refuses an unknown --ops name before it builds anything (no GPU
needed), and every name it knows is one of its ops."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "activation.py"


def test_unknown_op_is_refused_with_its_name():
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--ops", "dgelu_delayed_ct,dgelu_nope"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert "--ops: unknown op(s) ['dgelu_nope']" in r.stderr


def test_ops_names_are_the_timed_dict_keys():
    tree = ast.parse(SCRIPT.read_text())
    names = next(
        ast.literal_eval(n.value)
        for n in tree.body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "OPS"
    )
    keys = next(
        [k.value for k in n.value.keys]
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "ops"
    )
    assert list(names) == keys
