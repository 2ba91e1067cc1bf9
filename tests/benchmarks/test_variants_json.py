"""benchmarks/_variants.py's write_json: what mlp.py and transformer_layer.py write for --json."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def test_write_json_holds_the_meta_and_the_rows(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    sys.modules.pop("_variants", None)
    from _variants import write_json

    args = types.SimpleNamespace(iters=8, warmup=2, warmup_ms=100.0, rounds=3)
    rows = [{"variant": "torch", "ms": 1.5}, {"variant": "te_delayed", "error": "RuntimeError: x"}]
    path = tmp_path / "out.json"
    write_json(str(path), args, rows, inference=True)
    got = json.loads(path.read_text())
    assert got["results"] == rows
    meta = got["meta"]
    assert {k: meta[k] for k in ("iters", "warmup", "warmup_ms", "rounds", "inference")} == {
        "iters": 8,
        "warmup": 2,
        "warmup_ms": 100.0,
        "rounds": 3,
        "inference": True,
    }
    assert meta["torch"] == torch.__version__
    assert meta["gpu"] == (torch.cuda.get_device_name() if torch.cuda.is_available() else None)
    assert meta["commit"] is None or len(meta["commit"]) == 40
