"""Tensor and sequence parallelism of te.Linear, te.LayerNormLinear and te.LayerNormMLP (parallel_mode, tp_group, sequence_parallel): each
case runs two ranks as processes over gloo on the CPU (_tp_rank.py) and checks every output and
gradient twice, bit for bit against the rank's shard run as a te.Linear of its own with the
collectives written out, and against the whole layer computed in fp32."""

import pytest
import te_torch as te
import torch
from _tp_rank import check_layernorm_linear, check_layernorm_mlp, check_linear, check_mlp, run


@pytest.mark.parametrize("recipe", ["none", "current", "delayed", "block"])
def test_linear_split_by_columns_and_rows_computes_the_whole_layer(tmp_path, recipe):
    check_linear(run(tmp_path, 2, "linear", recipe), recipe)


@pytest.mark.parametrize("recipe", ["none", "current"])
def test_layernorm_linear_split_by_columns_computes_the_whole_layer(tmp_path, recipe):
    check_layernorm_linear(run(tmp_path, 2, "layernorm_linear", recipe), recipe)


@pytest.mark.parametrize("recipe", ["none", "current"])
def test_layernorm_mlp_split_by_set_parallel_mode_computes_the_whole_mlp(tmp_path, recipe):
    check_layernorm_mlp(run(tmp_path, 2, "layernorm_mlp", recipe), recipe)


@pytest.mark.parametrize("recipe", ["none", "current"])
def test_megatron_mlp_of_a_column_and_a_row_layer_computes_the_whole_mlp(tmp_path, recipe):
    check_mlp(run(tmp_path, 2, "mlp", recipe), recipe)


def test_misuse_fails_on_every_rank_before_any_collective_and_compile_runs_eagerly(tmp_path):
    for r in run(tmp_path, 2, "errors", "none"):
        assert (
            r["size_mismatch"]
            == "ValueError: Linear: tp_size=3 but tp_group has 2 ranks; pass one or the other"
        )
        assert r["no_group"].startswith("RuntimeError: Linear: tp_size=2 but no tensor-parallel group")
        assert "set_tensor_parallel_group(group) before the forward" in r["no_group"]
        assert r["wrong_group"] == (
            "ValueError: Linear: set_tensor_parallel_group: the group has 2 ranks, but the module was "
            "built for tp_size=4"
        )
        assert r["group_set_later"] is None
        assert "expected a size divisible by 2, got shape (65, 256)" in r["sp_rows"]
        assert r["row_fp8_output"].startswith(
            "NotImplementedError: Linear: fp8_output with parallel_mode='row'"
        )
        assert r["column_fp8_grad"].startswith("NotImplementedError: Linear: a quantized input or fp8_grad")
        assert r["compiled_equal"] is True


def test_split_sizes_and_parameter_attributes_follow_te():
    col = te.Linear(64, 96, parallel_mode="column", tp_size=2, device="cpu")
    assert (col.in_features, col.out_features) == (64, 48)
    assert col.weight.shape == (48, 64) and col.bias.shape == (48,)
    assert (col.weight.tensor_model_parallel, col.weight.partition_dim, col.weight.partition_stride) == (
        True,
        0,
        1,
    )
    assert (col.bias.tensor_model_parallel, col.bias.partition_dim) == (True, 0)
    row = te.Linear(64, 96, parallel_mode="row", tp_size=2, sequence_parallel=True, device="cpu")
    assert (row.in_features, row.out_features, row.sequence_parallel) == (32, 96, True)
    assert row.weight.shape == (96, 32) and row.bias.shape == (96,)
    assert (row.weight.tensor_model_parallel, row.weight.partition_dim) == (True, 1)
    assert row.bias.sequence_parallel is True
    # sequence parallelism needs more than one rank (TE's rule); not split: no attributes set true
    plain = te.Linear(64, 96, sequence_parallel=True, device="cpu")
    assert plain.sequence_parallel is False and plain.weight.tensor_model_parallel is False
    split = te.Linear(64, 96, parallel_mode="column", tp_size=2, parameters_split=("q", "k"), device="cpu")
    assert split.q_weight.shape == (24, 64) and split.k_bias.shape == (24,)


def test_layernorm_mlp_splits_ffn_and_marks_its_parameters():
    m = te.LayerNormMLP(
        64, 256, activation="swiglu", set_parallel_mode=True, tp_size=2, sequence_parallel=True
    )
    assert (m.ffn_hidden_size, m.size_per_partition) == (256, 128)
    assert m.fc1_weight.shape == (256, 64) and m.fc2_weight.shape == (64, 128)  # gated: two halves
    assert (m.fc1_weight.partition_dim, m.fc2_weight.partition_dim) == (0, 1)
    assert m.fc2_bias.sequence_parallel and m.layer_norm_weight.sequence_parallel
    with pytest.raises(RuntimeError, match=r"LayerNormMLP: tp_size=2 but no tensor-parallel group"):
        m(torch.randn(4, 64, device=m.fc1_weight.device))


def test_a_layer_split_over_one_rank_is_the_plain_layer():
    torch.manual_seed(0)
    plain = te.Linear(64, 96, device="cpu")
    x = torch.randn(16, 64)
    for mode in ("column", "row"):
        one = te.Linear(64, 96, parallel_mode=mode, tp_size=1, device="cpu")
        one.load_state_dict(plain.state_dict())
        with te.autocast(recipe=te.recipe.Float8CurrentScaling()):
            assert torch.equal(one(x), plain(x))


def test_bad_arguments_say_what_was_expected():
    with pytest.raises(ValueError, match=r"parallel_mode: expected None, 'column' or 'row', got 'Column'"):
        te.Linear(64, 96, parallel_mode="Column", device="cpu")
    with pytest.raises(ValueError, match=r"out_features=96 does not split over tp_size=5 ranks"):
        te.Linear(64, 96, parallel_mode="column", tp_size=5, device="cpu")
    with pytest.raises(ValueError, match=r"in_features=64 does not split over tp_size=3 ranks"):
        te.Linear(64, 96, parallel_mode="row", tp_size=3, device="cpu")
    with pytest.raises(ValueError, match=r"parameters_split\['q'\]=50 does not split over tp_size=4"):
        te.Linear(
            64, 96, parallel_mode="column", tp_size=4, parameters_split={"q": 50, "k": 46}, device="cpu"
        )
    with pytest.raises(
        TypeError, match="tp_group: expected a torch.distributed ProcessGroup or None, got 'world'"
    ):
        te.Linear(64, 96, parallel_mode="column", tp_group="world", device="cpu")
    with pytest.raises(ValueError, match="tp_size: expected an int >= 1, got 0"):
        te.Linear(64, 96, tp_size=0, device="cpu")
    with pytest.raises(
        TypeError, match=r"get_rng_state_tracker: expected a callable\(weight\) or None, got 3"
    ):
        te.Linear(64, 96, get_rng_state_tracker=3, device="cpu")
    late = te.Linear(64, 96, parallel_mode="column", tp_size=2, device="cpu")
    with pytest.raises(RuntimeError, match=r"call set_tensor_parallel_group\(group\) before the forward"):
        late(torch.randn(4, 64))


class _Tracker:
    """Megatron's RNG tracker's interface: fork() switches to the model-parallel generator."""

    def __init__(self) -> None:
        self.forks: list = []

    def fork(self, name="model-parallel-rng"):
        import contextlib

        self.forks.append(name)
        return contextlib.nullcontext()


def test_weights_initialise_under_the_rng_trackers_fork():
    tracker = _Tracker()
    te.Linear(64, 96, parallel_mode="column", tp_size=2, get_rng_state_tracker=lambda: tracker, device="cpu")
    te.Linear(64, 96, get_rng_state_tracker=lambda: tracker, rng_tracker_name="expert", device="cpu")
    assert tracker.forks == ["model-parallel-rng", "expert"]
