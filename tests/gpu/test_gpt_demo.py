"""The GPT demo (examples/gpt) on CUDA: a few training steps under each recipe against the same
run on te's CPU backend (same seed, init and batches), and the GPU presets' full-size models for
a few steps through the demo's entry point (JSON and PNG written, losses finite).

The model keeps fp32 parameters and runs bf16 activations (torch.autocast), so its FP8 GEMMs
take fp32 biases: a case the module tests (one parameter dtype throughout) do not cover.

Tolerances: the first step's loss is a forward of identical parameters on identical bytes, so
CUDA and CPU differ only by accumulation order under bf16/FP8 rounding (5e-3 relative). Later
steps compound those differences through AdamW (2e-2 relative after six steps).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

_GPT = Path(__file__).resolve().parents[2] / "examples" / "gpt"
if str(_GPT) not in sys.path:
    sys.path.insert(0, str(_GPT))

import demo  # noqa: E402
from _data import load_corpus  # noqa: E402
from _model import GPTConfig  # noqa: E402
from _presets import RECIPES, Preset  # noqa: E402
from _train import train  # noqa: E402

SMALL = Preset(
    "gpu-test",
    GPTConfig(seq=64, layers=2, hidden=256, heads=4, ffn=1024),
    batch=4,
    steps=6,
    lr=3e-3,
    warmup=2,
    eval_windows=16,
    timing_skip=2,
    log_every=3,
)


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_cuda_training_matches_cpu(recipe, corpus):
    gpu = train(SMALL, recipe, corpus, "cuda", show_progress=False)
    cpu = train(SMALL, recipe, corpus, "cpu", show_progress=False)
    assert all(math.isfinite(v) for v in gpu["losses"]) and gpu["diverged_at"] is None
    assert gpu["losses"][0] == pytest.approx(cpu["losses"][0], rel=5e-3)
    assert gpu["losses"][-1] == pytest.approx(cpu["losses"][-1], rel=2e-2)
    assert gpu["held_out_loss"] == pytest.approx(cpu["held_out_loss"], rel=2e-2)
    assert gpu["losses"][-1] < gpu["losses"][0] - 0.5
    assert gpu["memory_kind"] == "torch.cuda.max_memory_allocated" and gpu["peak_mib"] > 0


@pytest.mark.parametrize(
    "preset, recipes, steps",
    [("gpu-convergence", "bf16,delayed,current,block", 3), ("gpu-large", "bf16,delayed", 2)],
)
def test_gpu_presets_run(preset, recipes, steps, tmp_path):
    rc = demo.main(["--preset", preset, "--recipes", recipes, "--steps", str(steps), "--out", str(tmp_path)])
    report = json.loads((tmp_path / f"gpt_{preset}.json").read_text())
    errors = [r["error"] for r in report["results"] if "error" in r]
    assert rc == 0 and not errors, errors
    assert [r["recipe"] for r in report["results"]] == recipes.split(",")
    for r in report["results"]:
        assert len(r["losses"]) == steps and all(math.isfinite(v) for v in r["losses"])
        assert math.isfinite(r["held_out_loss"]) and r["peak_mib"] > 0
    assert (tmp_path / f"gpt_{preset}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
