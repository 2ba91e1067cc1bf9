"""Tensor and sequence parallelism of te.Linear, te.LayerNormLinear and te.LayerNormMLP on CUDA (NCCL, one GPU a rank):
tests/torch/test_tensor_parallel.py's ranks with the CUDA kernels. It needs two GPUs; on a
machine with fewer it says so and skips."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("te_torch")

_TORCH_TESTS = Path(__file__).resolve().parents[1] / "torch"
if str(_TORCH_TESTS) not in sys.path:
    sys.path.insert(0, str(_TORCH_TESTS))

from _tp_rank import check_layernorm_linear, check_layernorm_mlp, check_linear, check_mlp, run  # noqa: E402


def _need_two_gpus() -> None:
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n < 2:
        pytest.skip(f"tensor parallelism on CUDA needs 2 GPUs (NCCL ranks); this machine has {n}")


@pytest.mark.parametrize("recipe", ["none", "current", "delayed", "block"])
def test_linear_split_by_columns_and_rows_computes_the_whole_layer_on_cuda(tmp_path, recipe):
    _need_two_gpus()
    check_linear(run(tmp_path, 2, "linear", recipe, "cuda"), recipe)


@pytest.mark.parametrize("recipe", ["none", "current"])
def test_layernorm_linear_split_by_columns_computes_the_whole_layer_on_cuda(tmp_path, recipe):
    _need_two_gpus()
    check_layernorm_linear(run(tmp_path, 2, "layernorm_linear", recipe, "cuda"), recipe)


@pytest.mark.parametrize("recipe", ["none", "current"])
def test_layernorm_mlp_split_by_set_parallel_mode_computes_the_whole_mlp_on_cuda(tmp_path, recipe):
    _need_two_gpus()
    check_layernorm_mlp(run(tmp_path, 2, "layernorm_mlp", recipe, "cuda"), recipe)


@pytest.mark.parametrize("recipe", ["none", "current"])
def test_megatron_mlp_computes_the_whole_mlp_on_cuda(tmp_path, recipe):
    _need_two_gpus()
    check_mlp(run(tmp_path, 2, "mlp", recipe, "cuda"), recipe)
