"""A Transformer Engine checkpoint's ``_extra_state`` (TE 2.x: a uint8 tensor holding
``pickle.dumps`` of its FP8 metadata) loads into te's modules: the DelayedScaling state lands in
te's layout GEMM by GEMM, a TE module that never ran in FP8 loads as no state, and a pickle naming
anything but tensors and TE's own classes is refused before it runs.

TE is not installed here: its checkpoint is made the way TE's module base makes it (its recipe a
dataclass of the module ``transformer_engine.common.recipe``, with an Enum and a namedtuple field),
by stand-in classes that are removed again before te reads the bytes."""

from __future__ import annotations

import dataclasses
import enum
import pickle
import sys
import types
from collections import namedtuple

import pytest
import te_torch as te
import torch

TE_MODULES = ("transformer_engine", "transformer_engine.common", "transformer_engine.common.recipe")


def _te_extra_state(payload) -> torch.Tensor:
    """``payload`` pickled as TE's get_extra_state does, with TE's recipe classes importable only
    while pickling."""
    mod = types.ModuleType("transformer_engine.common.recipe")

    class Format(enum.Enum):
        E4M3 = 1
        HYBRID = 3

    override = namedtuple("_OverrideLinearPrecision", ["fprop", "dgrad", "wgrad"])

    @dataclasses.dataclass
    class DelayedScaling:
        margin: int = 0
        fp8_format: Format = Format.HYBRID
        amax_history_len: int = 4
        amax_compute_algo: str = "max"
        override_linear_precision: tuple = override(False, False, False)
        scaling_factor_compute_algo: object = None
        reduce_amax: bool = True

    for cls in (Format, override, DelayedScaling):
        cls.__module__, cls.__qualname__ = mod.__name__, cls.__name__
        setattr(mod, cls.__name__, cls)
    saved = {name: sys.modules.get(name) for name in TE_MODULES}
    sys.modules.update({name: types.ModuleType(name) for name in TE_MODULES[:2]})
    sys.modules[mod.__name__] = mod
    try:
        if isinstance(payload, dict):
            payload = {"recipe": DelayedScaling(), **payload}
        data = pickle.dumps(payload)
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
    assert "transformer_engine.common.recipe" not in sys.modules
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _delayed(n_gemms: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "scale_fwd": torch.rand(3 * n_gemms, generator=g) * 100 + 1,
        "amax_history_fwd": torch.rand(4, 3 * n_gemms, generator=g),
        "scale_bwd": torch.rand(2 * n_gemms, generator=g) * 100 + 1,
        "amax_history_bwd": torch.rand(4, 2 * n_gemms, generator=g),
        "extra_fp8_variables": {"num_gemms": n_gemms, "fp8_checkpoint": True, "recipe_kind": (1, "x")},
    }


def _step(m, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, m_in(m), generator=g, requires_grad=True)
    with te.autocast(recipe=te.recipe.DelayedScaling(amax_history_len=4)):
        y = m(x)
    y.backward(torch.randn(y.shape, generator=g))
    return [y.detach(), x.grad, *(p.grad for p in m.parameters())]


def m_in(m) -> int:
    return m.layer_norm_weight.shape[0] if hasattr(m, "layer_norm_weight") else m.weight.shape[1]


@pytest.mark.parametrize(
    "make",
    [
        lambda: te.Linear(64, 32, device="cpu"),
        lambda: te.LayerNormLinear(64, 32, device="cpu"),
    ],
    ids=["Linear", "LayerNormLinear"],
)
def test_one_gemm_modules_take_te_state_and_step_as_with_their_own(make):
    torch.manual_seed(0)
    a = make()
    te_state = _delayed(1, seed=1)
    a.load_state_dict({**a.state_dict(), "_extra_state": _te_extra_state(te_state)})
    st = a.state_dict()["_extra_state"]
    for te_key, key in (
        ("scale_fwd", "fwd_scale"),
        ("amax_history_fwd", "fwd_amax_history"),
        ("scale_bwd", "bwd_scale"),
        ("amax_history_bwd", "bwd_amax_history"),
    ):
        assert torch.equal(st[key], te_state[te_key]), key
    b = make()  # the same state in te's own format
    b.load_state_dict({**a.state_dict()})
    for got, want in zip(_step(a, 5), _step(b, 5), strict=True):
        assert torch.equal(got, want)


def test_layernorm_mlp_splits_te_columns_gemm_by_gemm():
    """TE's LayerNormMLP keeps fc1's roles in forward columns 0-2 and backward 0-1 (GEMM1_*,
    GRAD_OUTPUT1 / GRAD_INPUT1), fc2's in 3-5 and 2-3."""
    m = te.LayerNormMLP(64, 128, device="cpu")
    te_state = _delayed(2, seed=2)
    m.load_state_dict({**m.state_dict(), "_extra_state": _te_extra_state(te_state)})
    st = m.state_dict()["_extra_state"]
    for k, name in enumerate(("fc1", "fc2")):
        assert torch.equal(st[name]["fwd_amax_history"], te_state["amax_history_fwd"][:, 3 * k : 3 * k + 3])
        assert torch.equal(st[name]["fwd_scale"], te_state["scale_fwd"][3 * k : 3 * k + 3])
        assert torch.equal(st[name]["bwd_amax_history"], te_state["amax_history_bwd"][:, 2 * k : 2 * k + 2])
        assert torch.equal(st[name]["bwd_scale"], te_state["scale_bwd"][2 * k : 2 * k + 2])


def test_grouped_linear_takes_te_columns_gemm_by_gemm():
    """TE's GroupedLinear keeps GEMM i's input, weight and output in forward columns 3i..3i+2 and
    its grad_output / grad_input in backward columns 2i..2i+1 (its per-GEMM offsets)."""
    m = te.GroupedLinear(3, 64, 32, device="cpu")
    te_state = _delayed(3, seed=3)
    m.load_state_dict({**m.state_dict(), "_extra_state": _te_extra_state(te_state)})
    st = m.state_dict()["_extra_state"]
    for k in range(3):
        g = st[f"gemm{k}"]
        assert torch.equal(g["fwd_amax_history"], te_state["amax_history_fwd"][:, 3 * k : 3 * k + 3])
        assert torch.equal(g["fwd_scale"], te_state["scale_fwd"][3 * k : 3 * k + 3])
        assert torch.equal(g["bwd_amax_history"], te_state["amax_history_bwd"][:, 2 * k : 2 * k + 2])
        assert torch.equal(g["bwd_scale"], te_state["scale_bwd"][2 * k : 2 * k + 2])


@pytest.mark.parametrize(
    "payload", [None, {"extra_fp8_variables": {"num_gemms": 1}}], ids=["never in FP8", "stateless recipe"]
)
def test_te_modules_without_delayed_state_load_as_none(payload):
    m = te.Linear(64, 32, device="cpu")
    _step(m, 1)
    assert m.state_dict()["_extra_state"]
    m.load_state_dict({**m.state_dict(), "_extra_state": _te_extra_state(payload)})
    assert m.state_dict()["_extra_state"] == {}


_CALLED = []


def _not_tensor_data(*args):
    _CALLED.append(args)
    return None


class _Smuggled:
    def __reduce__(self):
        return (_not_tensor_data, ("ran",))


def test_a_pickle_naming_other_code_is_refused_before_it_runs():
    m = te.Linear(64, 32, device="cpu")
    bad = torch.frombuffer(bytearray(pickle.dumps({"amax_history_fwd": _Smuggled()})), dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"names .*_not_tensor_data, which te does not load"):
        m.load_state_dict({**m.state_dict(), "_extra_state": bad})
    assert not _CALLED


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (
            _delayed(2, seed=3),
            r"\['amax_history_fwd'\]: expected a tensor with 3 columns .* got torch.float32 \[4, 6\]",
        ),
        (b"\x80\x04not a pickle", r"not a pickle te can read"),
    ],
    ids=["another module's state", "not a pickle"],
)
def test_foreign_state_says_what_was_expected(extra, match):
    m = te.Linear(64, 32, device="cpu")
    t = (
        torch.frombuffer(bytearray(extra), dtype=torch.uint8)
        if isinstance(extra, bytes)
        else _te_extra_state(extra)
    )
    with pytest.raises(
        ValueError, match=r"Linear: _extra_state \(a Transformer Engine checkpoint's FP8 metadata\).*" + match
    ):
        m.load_state_dict({**m.state_dict(), "_extra_state": t})
