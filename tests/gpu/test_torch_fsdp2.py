"""FSDP2 over te's FP8 weights on CUDA (NCCL): tests/torch/test_fsdp2.py's ranks with the CUDA
kernels (the transpose after each all-gather, the shard quantize with the group's amax, the tile
shards' scales). Two GPUs give two ranks; one GPU runs one rank, which still shards, gathers and
re-quantizes through the same hooks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("te_torch")

_TORCH_TESTS = Path(__file__).resolve().parents[1] / "torch"
if str(_TORCH_TESTS) not in sys.path:
    sys.path.insert(0, str(_TORCH_TESTS))

from _fsdp2_rank import SHARD, WIRE, run  # noqa: E402


def _world() -> int:
    return min(torch.cuda.device_count(), 2) if torch.cuda.is_available() else 1


@pytest.mark.parametrize("recipe", ["current", "delayed", "block", "block1d", "mxfp8", "nvfp4"])
def test_fsdp2_fp8_shards_train_as_one_process_on_cuda(tmp_path, recipe):
    world = _world()
    for r in run(tmp_path, world, recipe, "train", "cuda"):
        for shard in r["shards"]:
            assert shard == [SHARD[recipe], 1, recipe in ("current", "delayed", "block"), True, True]
        for s in r["steps"]:
            assert s["scales_equal"] and s["y_equal"] and s["g_err"] == 0.0, s
        # one rank: the parts packed into one uint8 input (FSDP2's one-rank path copies only the first)
        assert r["wire"] == [WIRE[recipe] if world > 1 else ["torch.uint8"]] * 4


@pytest.mark.parametrize("recipe", ["current", "delayed", "block", "block1d", "mxfp8", "nvfp4"])
def test_fsdp2_fp8_shards_round_trip_through_dcp_on_cuda(tmp_path, recipe):
    for r in run(tmp_path, _world(), recipe, "dcp", "cuda"):
        assert r["equal"] and r["states_equal"] and r["shard"] == SHARD[recipe], r
