"""te_core.recipe: defaults, derived parameters, environment overrides and validation.

The expected numbers are written out here from NUMERICS.md and TE_REFERENCE.md section 2, not read
back from the module. Needs only the stdlib and pytest (run with PYTHONPATH=packages/te-core/src).
"""

import copy
import dataclasses
import pickle

import pytest
from te_core import recipe
from te_core.recipe import (
    CustomRecipe,
    DelayedScaling,
    ElementFormat,
    Float8BlockScaling,
    Float8CurrentScaling,
    Format,
    MMParams,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
    QParams,
    Recipe,
)

ENV_NAMES = [
    "BACKWARD_OVERRIDE",
    "FP8_CURRENT_SCALING_POWER_2_SCALES",
    "FP8_BLOCK_SCALING_FP32_SCALES",
    "NVFP4_DISABLE_RHT",
    "NVFP4_DISABLE_STOCHASTIC_ROUNDING",
    "NVFP4_DISABLE_2D_QUANTIZATION",
    "NVFP4_ROW_SCALED_ACTIVATION",
    "NVFP4_4OVER6",
    "NVFP4_4OVER6_E4M3_USE_256",
    "NVFP4_4OVER6_ERR_MODE",
]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """Defaults must not depend on the caller's environment."""
    for name in ENV_NAMES:
        monkeypatch.delenv("NVTE_" + name, raising=False)
        monkeypatch.delenv("TE_" + name, raising=False)


def factory(role):
    return None


ALL_RECIPES = [
    DelayedScaling,
    Float8CurrentScaling,
    Float8BlockScaling,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
    lambda: CustomRecipe(qfactory=factory),
]


# ------------------------------------------------------------------------------- formats
def test_format_maxima():
    assert (Format.E4M3.max_fwd, Format.E4M3.max_bwd) == (448, 448)
    assert (Format.E5M2.max_fwd, Format.E5M2.max_bwd) == (57344, 57344)
    assert (Format.HYBRID.max_fwd, Format.HYBRID.max_bwd) == (448, 57344)
    assert (Format.E2M1.max_fwd, Format.E2M1.max_bwd) == (6, 6)
    # TE code reads the maxima through .value
    assert Format.HYBRID.value.max_fwd == 448 and Format.HYBRID.value.max_bwd == 57344
    assert {f.name for f in Format} == {"E2M1", "E4M3", "E5M2", "HYBRID"}


def test_format_element_dtypes():
    assert (Format.E4M3.fwd_dtype, Format.E4M3.bwd_dtype) == (ElementFormat.E4M3,) * 2
    assert (Format.E5M2.fwd_dtype, Format.E5M2.bwd_dtype) == (ElementFormat.E5M2,) * 2
    assert (Format.HYBRID.fwd_dtype, Format.HYBRID.bwd_dtype) == (
        ElementFormat.E4M3,
        ElementFormat.E5M2,
    )
    assert (Format.E2M1.fwd_dtype, Format.E2M1.bwd_dtype) == (ElementFormat.E2M1,) * 2
    assert ElementFormat.E4M3.value == "float8_e4m3fn"
    assert ElementFormat.E5M2.value == "float8_e5m2"
    assert ElementFormat.E2M1.value == "float4_e2m1fn"
    assert (ElementFormat.E4M3.max, ElementFormat.E5M2.max, ElementFormat.E2M1.max) == (
        448.0,
        57344.0,
        6.0,
    )
    for fmt in Format:
        assert fmt.max_fwd == fmt.fwd_dtype.max and fmt.max_bwd == fmt.bwd_dtype.max
    assert repr(Format.HYBRID) == "Format.HYBRID" and str(Format.HYBRID) == "Format.HYBRID"


# ------------------------------------------------------------------------------- params
def test_mmparams_and_qparams_defaults():
    assert MMParams().use_split_accumulator is True
    q = QParams()
    assert q.power_2_scale is False
    assert q.amax_epsilon == 0.0
    assert q.random_hadamard_transform is False
    assert q.stochastic_rounding is False
    assert q.fp4_2d_quantization is False
    with pytest.raises(dataclasses.FrozenInstanceError):
        q.power_2_scale = True


def test_params_validation():
    with pytest.raises(TypeError, match=r"MMParams.use_split_accumulator: expected a bool, got 1"):
        MMParams(1)
    with pytest.raises(
        ValueError,
        match=r"QParams.amax_epsilon: expected a finite number >= 0, "
        r"got -1.0",
    ):
        QParams(amax_epsilon=-1.0)
    with pytest.raises(TypeError, match=r"QParams.stochastic_rounding: expected a bool, got 'no'"):
        QParams(stochastic_rounding="no")


# ------------------------------------------------------------------------------- defaults
def test_delayed_scaling_defaults():
    r = DelayedScaling()
    assert r.margin == 0
    assert r.fp8_format is Format.HYBRID
    assert r.amax_history_len == 1024
    assert r.amax_compute_algo == "max"
    assert r.scaling_factor_compute_algo is None
    assert r.reduce_amax is True
    assert r.fp8_dpa is False and r.fp8_mha is False
    assert r.backward_override is None
    # te's keyword-only GEMM fields: TE-PyTorch's fixed split accumulation (off, on, on)
    assert r.fp8_gemm_fprop == MMParams(use_split_accumulator=False)
    assert r.fp8_gemm_dgrad == MMParams(use_split_accumulator=True)
    assert r.fp8_gemm_wgrad == MMParams(use_split_accumulator=True)


def test_delayed_scaling_gemm_fields_are_keyword_only_and_checked():
    fast = MMParams(use_split_accumulator=False)
    r = DelayedScaling(fp8_gemm_dgrad=fast, fp8_gemm_wgrad=fast)
    assert (r.fp8_gemm_dgrad, r.fp8_gemm_wgrad) == (fast, fast)
    with pytest.raises(TypeError):
        DelayedScaling(0, Format.HYBRID, 1024, "max", None, True, False, False, None, fast)
    with pytest.raises(TypeError, match=r"DelayedScaling.fp8_gemm_wgrad: expected a MMParams, got False"):
        DelayedScaling(fp8_gemm_wgrad=False)
    with pytest.raises(TypeError, match=r"DelayedScaling.fp8_gemm_fprop: expected a MMParams, got True"):
        r.fp8_gemm_fprop = True
    assert r.fp8_gemm_fprop == MMParams(use_split_accumulator=False)


def test_delayed_scaling_positional_order_matches_te():
    r = DelayedScaling(2, Format.E4M3, 16, "most_recent", None, False, True, True)
    assert (r.margin, r.fp8_format, r.amax_history_len, r.amax_compute_algo) == (
        2,
        Format.E4M3,
        16,
        "most_recent",
    )
    assert (r.reduce_amax, r.fp8_dpa, r.fp8_mha) == (False, True, True)


def test_current_scaling_defaults_and_derived():
    r = Float8CurrentScaling()
    assert r.use_power_2_scales is False
    assert r.fp8_format is Format.HYBRID
    assert r.amax_epsilon == 0.0
    for q in (r.fp8_quant_fwd_inp, r.fp8_quant_fwd_weight, r.fp8_quant_bwd_grad):
        assert q == QParams(power_2_scale=False, amax_epsilon=0.0)
    # split accumulation: off for fprop, on for dgrad and wgrad
    assert r.fp8_gemm_fprop == MMParams(use_split_accumulator=False)
    assert r.fp8_gemm_dgrad == MMParams(use_split_accumulator=True)
    assert r.fp8_gemm_wgrad == MMParams(use_split_accumulator=True)
    assert r.fp8_dpa is False and r.fp8_mha is False
    assert r.backward_override is None


def test_current_scaling_derived_follows_fields():
    r = Float8CurrentScaling(use_power_2_scales=True, amax_epsilon=1e-12)
    for q in (r.fp8_quant_fwd_inp, r.fp8_quant_fwd_weight, r.fp8_quant_bwd_grad):
        assert q == QParams(power_2_scale=True, amax_epsilon=1e-12)
    r.use_power_2_scales = False
    assert r.fp8_quant_bwd_grad == QParams(power_2_scale=False, amax_epsilon=1e-12)
    # an assigned QParams is the user's and is kept when other fields change
    r.fp8_quant_fwd_weight = QParams(power_2_scale=True, amax_epsilon=0.5)
    r.amax_epsilon = 2.0
    assert r.fp8_quant_fwd_weight == QParams(power_2_scale=True, amax_epsilon=0.5)
    assert r.fp8_quant_fwd_inp == QParams(power_2_scale=False, amax_epsilon=2.0)
    # copies do not share the record of assigned fields
    c = copy.copy(r)
    c.fp8_quant_fwd_inp = QParams()
    r.amax_epsilon = 3.0
    assert r.fp8_quant_fwd_inp == QParams(amax_epsilon=3.0)


def test_block_scaling_defaults_and_derived():
    r = Float8BlockScaling()
    assert r.use_f32_scales is False
    assert r.fp8_format is Format.E4M3
    assert (r.x_block_scaling_dim, r.w_block_scaling_dim, r.grad_block_scaling_dim) == (
        1,
        2,
        1,
    )
    assert r.amax_epsilon == 0.0
    for q in (r.fp8_quant_fwd_inp, r.fp8_quant_fwd_weight, r.fp8_quant_bwd_grad):
        assert q == QParams(power_2_scale=True, amax_epsilon=0.0)  # power_2 = not use_f32_scales
    for mm in (r.fp8_gemm_fprop, r.fp8_gemm_dgrad, r.fp8_gemm_wgrad):
        assert mm == MMParams(use_split_accumulator=True)
    assert r.fp8_dpa is False and r.fp8_mha is False
    assert r.backward_override is None
    f32 = Float8BlockScaling(use_f32_scales=True)
    assert f32.fp8_quant_fwd_inp.power_2_scale is False


def test_mxfp8_defaults():
    r = MXFP8BlockScaling()
    assert r.margin == 0
    assert r.fp8_format is Format.E4M3
    assert r.fp8_dpa is False and r.fp8_mha is False
    assert r.backward_override is None
    assert r.enable_2d_quantization is False
    assert MXFP8BlockScaling(fp8_format=Format.HYBRID).fp8_format is Format.HYBRID


def test_nvfp4_defaults_and_derived():
    r = NVFP4BlockScaling()
    assert r.disable_rht is False
    assert r.disable_stochastic_rounding is False
    assert r.disable_2d_quantization is False
    assert r.row_scaled_activation is False
    assert r.nvfp4_4over6 == "none"
    assert r.nvfp4_4over6_e4m3_use_256 == "all"
    assert r.nvfp4_4over6_err_mode == "MAE"
    assert r.fp4_format is Format.E2M1 and r.fp8_format is Format.E4M3
    assert r.fp8_dpa is False and r.fp8_mha is False and r.backward_override is None
    assert r.fp4_quant_fwd_inp == QParams(random_hadamard_transform=True)
    assert r.fp4_quant_fwd_weight == QParams(fp4_2d_quantization=True)
    assert r.fp4_quant_bwd_grad == QParams(random_hadamard_transform=True, stochastic_rounding=True)
    off = NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True, disable_2d_quantization=True)
    for q in (off.fp4_quant_fwd_inp, off.fp4_quant_fwd_weight, off.fp4_quant_bwd_grad):
        assert q == QParams()
    r.disable_stochastic_rounding = True
    assert r.fp4_quant_bwd_grad == QParams(random_hadamard_transform=True)


def test_custom_recipe_defaults():
    r = CustomRecipe(factory)
    assert r.qfactory is factory
    assert r.fp8_format is Format.HYBRID
    assert r.fp8_dpa is False and r.fp8_mha is False
    assert r.backward_override is None
    assert r.quantization_alignment == 128
    with pytest.raises(TypeError):
        CustomRecipe()  # qfactory is required, as in TE


# ------------------------------------------------------------------------------- predicates
PREDICATES = [
    "delayed",
    "float8_current_scaling",
    "float8_per_tensor_scaling",
    "float8_block_scaling",
    "mxfp8",
    "nvfp4",
    "custom",
]


@pytest.mark.parametrize(
    "cls, true_ones",
    [
        (DelayedScaling, {"delayed", "float8_per_tensor_scaling"}),
        (Float8CurrentScaling, {"float8_current_scaling", "float8_per_tensor_scaling"}),
        (Float8BlockScaling, {"float8_block_scaling"}),
        (MXFP8BlockScaling, {"mxfp8"}),
        (NVFP4BlockScaling, {"nvfp4"}),
        (CustomRecipe, {"custom"}),
    ],
)
def test_predicates(cls, true_ones):
    assert issubclass(cls, Recipe)
    for name in PREDICATES:
        assert getattr(cls, name)() is (name in true_ones), name
    instance = cls(factory) if cls is CustomRecipe else cls()
    for name in PREDICATES:
        assert getattr(instance, name)() is (name in true_ones), name


def test_predicates_follow_subclasses():
    class MyDelayed(DelayedScaling):
        pass

    assert MyDelayed.delayed() and MyDelayed().float8_per_tensor_scaling()
    assert not MyDelayed.mxfp8()


# ------------------------------------------------------------------------------- environment
@pytest.mark.parametrize("prefix", ["NVTE_", "TE_"])
def test_env_overrides(monkeypatch, prefix):
    monkeypatch.setenv(prefix + "FP8_CURRENT_SCALING_POWER_2_SCALES", "1")
    monkeypatch.setenv(prefix + "FP8_BLOCK_SCALING_FP32_SCALES", "1")
    monkeypatch.setenv(prefix + "NVFP4_DISABLE_RHT", "1")
    monkeypatch.setenv(prefix + "NVFP4_DISABLE_STOCHASTIC_ROUNDING", "1")
    monkeypatch.setenv(prefix + "NVFP4_DISABLE_2D_QUANTIZATION", "1")
    monkeypatch.setenv(prefix + "NVFP4_ROW_SCALED_ACTIVATION", "1")
    monkeypatch.setenv(prefix + "NVFP4_4OVER6", "weights")
    monkeypatch.setenv(prefix + "NVFP4_4OVER6_E4M3_USE_256", "none")
    monkeypatch.setenv(prefix + "NVFP4_4OVER6_ERR_MODE", "mse")
    monkeypatch.setenv(prefix + "BACKWARD_OVERRIDE", "dequantized")

    cs = Float8CurrentScaling()
    assert cs.use_power_2_scales is True and cs.fp8_quant_fwd_inp.power_2_scale is True
    bs = Float8BlockScaling()
    assert bs.use_f32_scales is True and bs.fp8_quant_fwd_weight.power_2_scale is False
    nv = NVFP4BlockScaling()
    assert (
        nv.disable_rht,
        nv.disable_stochastic_rounding,
        nv.disable_2d_quantization,
        nv.row_scaled_activation,
    ) == (True, True, True, True)
    assert (
        nv.nvfp4_4over6,
        nv.nvfp4_4over6_e4m3_use_256,
        nv.nvfp4_4over6_err_mode,
    ) == ("weights", "none", "MSE")
    assert nv.fp4_quant_bwd_grad == QParams()
    for r in (cs, bs, nv, MXFP8BlockScaling(), CustomRecipe(factory)):
        assert r.backward_override == "dequantized"
    # DelayedScaling supports only None, so it does not take the environment default
    assert DelayedScaling().backward_override is None
    # an explicit argument beats the environment
    assert Float8CurrentScaling(use_power_2_scales=False).use_power_2_scales is False


def test_env_read_at_construction_and_te_prefix_wins(monkeypatch):
    assert Float8CurrentScaling().use_power_2_scales is False
    monkeypatch.setenv("NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES", "1")
    assert Float8CurrentScaling().use_power_2_scales is True
    monkeypatch.setenv("TE_FP8_CURRENT_SCALING_POWER_2_SCALES", "0")
    assert Float8CurrentScaling().use_power_2_scales is False
    monkeypatch.setenv("NVTE_BACKWARD_OVERRIDE", "dequantized")
    monkeypatch.setenv("TE_BACKWARD_OVERRIDE", "high_precision")
    assert MXFP8BlockScaling().backward_override == "high_precision"
    monkeypatch.setenv("TE_BACKWARD_OVERRIDE", "")  # set but empty: the default (None)
    assert MXFP8BlockScaling().backward_override is None


def test_env_bad_values(monkeypatch):
    monkeypatch.setenv("NVTE_NVFP4_DISABLE_RHT", "maybe")
    with pytest.raises(ValueError, match=r"NVTE_NVFP4_DISABLE_RHT: expected 0 or 1, got 'maybe'"):
        NVFP4BlockScaling()
    monkeypatch.setenv("TE_BACKWARD_OVERRIDE", "fp32")
    with pytest.raises(
        ValueError,
        match=r"MXFP8BlockScaling.backward_override: expected None or "
        r"'high_precision' or 'dequantized' .*got 'fp32'",
    ):
        MXFP8BlockScaling()


# ------------------------------------------------------------------------------- validation
E5M2_MSG = (
    r"fp8_format=Format.E5M2 is not supported: gradients-only E5M2 needs forward tensors "
    r"in E4M3; use Format.HYBRID"
)


@pytest.mark.parametrize(
    "make",
    [
        lambda f: DelayedScaling(fp8_format=f),
        lambda f: Float8CurrentScaling(fp8_format=f),
        lambda f: MXFP8BlockScaling(fp8_format=f),
        lambda f: CustomRecipe(factory, fp8_format=f),
    ],
)
def test_e5m2_rejected(make):
    with pytest.raises(ValueError, match=E5M2_MSG):
        make(Format.E5M2)
    with pytest.raises(
        ValueError,
        match=r"fp8_format: expected Format.E4M3 or Format.HYBRID, "
        r"got Format.E2M1",
    ):
        make(Format.E2M1)
    with pytest.raises(TypeError, match=r"fp8_format: expected a Format .*got 'HYBRID'"):
        make("HYBRID")


def test_block_scaling_format():
    for fmt in (Format.HYBRID, Format.E5M2, Format.E2M1):
        with pytest.raises(
            ValueError,
            match=r"Float8BlockScaling.fp8_format: expected "
            rf"Format.E4M3, got Format.{fmt.name}",
        ):
            Float8BlockScaling(fp8_format=fmt)


def test_block_scaling_dims():
    with pytest.raises(
        ValueError,
        match=r"Float8BlockScaling.x_block_scaling_dim: expected one "
        r"of \(1, 2\), got 3",
    ):
        Float8BlockScaling(x_block_scaling_dim=3)
    with pytest.raises(ValueError, match=r"w_block_scaling_dim: expected one of \(1, 2\), got 0"):
        Float8BlockScaling(w_block_scaling_dim=0)
    with pytest.raises(
        TypeError,
        match=r"grad_block_scaling_dim: expected one of \(1, 2\), got "
        r"1.0",
    ):
        Float8BlockScaling(grad_block_scaling_dim=1.0)
    with pytest.raises(
        ValueError,
        match=r"x_block_scaling_dim=2 with w_block_scaling_dim=2 makes "
        r"the fprop GEMM 2D x 2D",
    ):
        Float8BlockScaling(x_block_scaling_dim=2)
    with pytest.raises(
        ValueError,
        match=r"grad_block_scaling_dim=2 with w_block_scaling_dim=2 "
        r"makes the dgrad GEMM 2D x 2D",
    ):
        Float8BlockScaling(grad_block_scaling_dim=2)
    with pytest.raises(
        ValueError,
        match=r"x_block_scaling_dim=2 with grad_block_scaling_dim=2 "
        r"makes the wgrad GEMM 2D x 2D",
    ):
        Float8BlockScaling(x_block_scaling_dim=2, w_block_scaling_dim=1, grad_block_scaling_dim=2)
    # every combination with at most one 2D operand per GEMM is accepted, as in TE
    for x, w, g in [(1, 1, 1), (1, 2, 1), (2, 1, 1), (1, 1, 2)]:
        Float8BlockScaling(x_block_scaling_dim=x, w_block_scaling_dim=w, grad_block_scaling_dim=g)


@pytest.mark.parametrize("name", ["fp8_dpa", "fp8_mha"])
def test_block_scaling_rejects_fp8_attention(name):
    with pytest.raises(
        ValueError,
        match=rf"Float8BlockScaling.{name}: expected False \(FP8 "
        r"attention is not supported with Float8BlockScaling\), "
        r"got True",
    ):
        Float8BlockScaling(**{name: True})


def test_block_scaling_requires_split_accumulator():
    with pytest.raises(
        ValueError,
        match=r"Float8BlockScaling.fp8_gemm_fprop: expected "
        r"MMParams\(use_split_accumulator=True\)",
    ):
        Float8BlockScaling(fp8_gemm_fprop=MMParams(False))


def test_delayed_scaling_validation():
    with pytest.raises(
        ValueError,
        match=r"DelayedScaling.amax_history_len: expected an int >= 1, "
        r"got 0",
    ):
        DelayedScaling(amax_history_len=0)
    with pytest.raises(
        TypeError,
        match=r"DelayedScaling.amax_history_len: expected an int >= 1, "
        r"got 16.0",
    ):
        DelayedScaling(amax_history_len=16.0)
    with pytest.raises(
        ValueError,
        match=r"DelayedScaling.amax_compute_algo: expected 'max', "
        r"'most_recent' or a callable, got 'mean'",
    ):
        DelayedScaling(amax_compute_algo="mean")
    with pytest.raises(
        ValueError,
        match=r"DelayedScaling.margin: expected a finite number >= 0, "
        r"got -1",
    ):
        DelayedScaling(margin=-1)
    with pytest.raises(
        TypeError,
        match=r"DelayedScaling.margin: expected a finite number >= 0, "
        r"got '1'",
    ):
        DelayedScaling(margin="1")
    with pytest.raises(
        TypeError,
        match=r"DelayedScaling.scaling_factor_compute_algo: expected "
        r"None or a callable, got 2.0",
    ):
        DelayedScaling(scaling_factor_compute_algo=2.0)
    with pytest.raises(TypeError, match=r"DelayedScaling.reduce_amax: expected a bool, got 1"):
        DelayedScaling(reduce_amax=1)
    for bo in ("high_precision", "dequantized"):
        with pytest.raises(
            ValueError,
            match=r"DelayedScaling.backward_override: expected None "
            rf"\(DelayedScaling supports no backward override\), "
            rf"got '{bo}'",
        ):
            DelayedScaling(backward_override=bo)
    # accepted: callables, "most_recent", float margin
    DelayedScaling(
        amax_compute_algo=lambda h: h,
        margin=0.5,
        scaling_factor_compute_algo=lambda amax, scale, fp8_max, r: scale,
    )
    DelayedScaling(amax_compute_algo="most_recent", amax_history_len=1)


@pytest.mark.parametrize("cls", [Float8CurrentScaling, Float8BlockScaling])
def test_amax_epsilon_validation(cls):
    name = cls.__name__
    with pytest.raises(
        ValueError,
        match=rf"{name}.amax_epsilon: expected a finite number >= 0, "
        r"got -1e-06",
    ):
        cls(amax_epsilon=-1e-6)
    with pytest.raises(ValueError, match=rf"{name}.amax_epsilon: .*got inf"):
        cls(amax_epsilon=float("inf"))


@pytest.mark.parametrize(
    "make",
    [
        lambda bo: Float8CurrentScaling(backward_override=bo),
        lambda bo: Float8BlockScaling(backward_override=bo),
        lambda bo: MXFP8BlockScaling(backward_override=bo),
        lambda bo: NVFP4BlockScaling(backward_override=bo),
        lambda bo: CustomRecipe(factory, backward_override=bo),
    ],
)
def test_backward_override(make):
    for ok in (None, "high_precision", "dequantized"):
        assert make(ok).backward_override == ok
    with pytest.raises(
        ValueError,
        match=r"backward_override: expected None or 'high_precision' "
        r"or 'dequantized' .*got 'fp32'",
    ):
        make("fp32")


def test_mxfp8_validation():
    with pytest.raises(
        ValueError,
        match=r"MXFP8BlockScaling.margin: expected a finite number "
        r">= 0, got -2",
    ):
        MXFP8BlockScaling(margin=-2)
    with pytest.raises(
        TypeError,
        match=r"MXFP8BlockScaling.enable_2d_quantization: expected a "
        r"bool, got None",
    ):
        MXFP8BlockScaling(enable_2d_quantization=None)


def test_nvfp4_validation():
    for fmt in (Format.E4M3, Format.HYBRID, Format.E5M2):
        with pytest.raises(
            ValueError,
            match=r"NVFP4BlockScaling.fp4_format: expected Format.E2M1, "
            rf"got Format.{fmt.name}",
        ):
            NVFP4BlockScaling(fp4_format=fmt)
    with pytest.raises(
        ValueError,
        match=r"NVFP4BlockScaling.fp8_format: expected Format.E4M3, "
        r"got Format.HYBRID",
    ):
        NVFP4BlockScaling(fp8_format=Format.HYBRID)
    with pytest.raises(
        ValueError,
        match=r"NVFP4BlockScaling.nvfp4_4over6: expected one of "
        r"\('none', 'weights', 'activations', 'all'\), got 'some'",
    ):
        NVFP4BlockScaling(nvfp4_4over6="some")
    with pytest.raises(
        ValueError,
        match=r"nvfp4_4over6_err_mode: expected one of \('MAE', 'MSE'\)"
        r", got 'L1'",
    ):
        NVFP4BlockScaling(nvfp4_4over6_err_mode="L1")
    with pytest.raises(TypeError, match=r"NVFP4BlockScaling.disable_rht: expected a bool, got 0"):
        NVFP4BlockScaling(disable_rht=0)


def test_custom_recipe_validation():
    with pytest.raises(TypeError, match=r"CustomRecipe.qfactory: expected a callable, got 3"):
        CustomRecipe(3)
    with pytest.raises(
        ValueError,
        match=r"CustomRecipe.quantization_alignment: expected an int "
        r">= 1, got 0",
    ):
        CustomRecipe(factory, quantization_alignment=0)


@pytest.mark.parametrize("make", ALL_RECIPES)
def test_bool_fields_are_checked(make):
    r = make()
    for name in ("fp8_dpa", "fp8_mha"):
        with pytest.raises(
            TypeError,
            match=rf"{type(r).__name__}.{name}: expected a bool, "
            r"got 'yes'",
        ):
            setattr(r, name, "yes")


# ------------------------------------------------------------------------------- mutation
def test_assignment_revalidates_and_rolls_back():
    r = DelayedScaling()
    r.amax_history_len = 16
    assert r.amax_history_len == 16
    with pytest.raises(
        ValueError,
        match=r"DelayedScaling.amax_history_len: expected an int >= 1, "
        r"got -4",
    ):
        r.amax_history_len = -4
    assert r.amax_history_len == 16
    b = Float8BlockScaling()
    with pytest.raises(ValueError, match=r"fprop GEMM 2D x 2D"):
        b.x_block_scaling_dim = 2
    assert b.x_block_scaling_dim == 1
    c = Float8CurrentScaling()
    with pytest.raises(ValueError, match=r"amax_epsilon"):
        c.amax_epsilon = -1.0
    assert c.amax_epsilon == 0.0 and c.fp8_quant_fwd_inp.amax_epsilon == 0.0
    with pytest.raises(
        TypeError,
        match=r"Float8CurrentScaling.fp8_quant_fwd_inp: expected a "
        r"QParams, got None",
    ):
        c.fp8_quant_fwd_inp = None
    assert c.fp8_quant_fwd_inp == QParams()
    c.use_power_2_scales = True  # the failed assignment above did not mark the field as the user's
    assert c.fp8_quant_fwd_inp.power_2_scale is True


# ------------------------------------------------------------------------------- repr, copies
@pytest.mark.parametrize("make", ALL_RECIPES)
def test_repr_copy_pickle(make):
    r = make()
    text = repr(r)
    assert text.startswith(type(r).__name__ + "(")
    assert "fp8_format=Format." in text
    assert copy.deepcopy(r) == r
    if not isinstance(r, CustomRecipe):  # CustomRecipe pickles when its factory does
        assert pickle.loads(pickle.dumps(r)) == r
    assert dataclasses.replace(r, backward_override=None).backward_override is None
    with pytest.raises(ValueError, match="backward_override"):
        dataclasses.replace(r, backward_override="fp32")


def test_repr_contents():
    assert repr(DelayedScaling()) == (
        "DelayedScaling(margin=0, fp8_format=Format.HYBRID, amax_history_len=1024, "
        "amax_compute_algo='max', scaling_factor_compute_algo=None, reduce_amax=True, "
        "fp8_dpa=False, fp8_mha=False, backward_override=None, "
        "fp8_gemm_fprop=MMParams(use_split_accumulator=False), "
        "fp8_gemm_dgrad=MMParams(use_split_accumulator=True), "
        "fp8_gemm_wgrad=MMParams(use_split_accumulator=True))"
    )
    assert repr(MMParams(False)) == "MMParams(use_split_accumulator=False)"
    assert "fp8_gemm_fprop=MMParams(use_split_accumulator=False)" in repr(Float8CurrentScaling())


def test_public_names():
    assert set(recipe.__all__) >= {
        "Format",
        "MMParams",
        "QParams",
        "Recipe",
        "DelayedScaling",
        "Float8CurrentScaling",
        "Float8BlockScaling",
        "MXFP8BlockScaling",
        "NVFP4BlockScaling",
        "CustomRecipe",
    }
