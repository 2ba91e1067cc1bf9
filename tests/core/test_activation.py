"""Activations (te/activation.h) on the CPU backend: forward and backward against an independent
float64 reference of TE's formulas, gated kinds with the activation half first, the fused dbias,
quantized outputs against "activation in fp32, then te_quantize" and the oracle, error paths.
CLAMPED_SWIGLU (GPT-OSS's) also with its te_activation_config parameters, around and beyond its
clamps, against numpy's minimum / clip and a finite-difference check of the reference's
derivative."""

import re

import _oracle as O
import numpy as np
import pytest
from _buffers import assert_bits_equal, f32, rng_for, tensor
from _fused import BF16, HP_TYPES, assert_matches_ref, check_quantized, dtype_id, hp_output, make_quantized
from te_core import _C

A = _C.Activation
SHAPES = [(1, 1), (7, 13), (129, 257), (2, 3, 17)]


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def gelu(x):
    return x * (0.5 + 0.5 * np.tanh(x * (0.79788456 + 0.03567741 * x * x)))


def dgelu(x):
    t = np.tanh(0.79788456 * x * (1.0 + 0.044715 * x * x))
    return 0.5 * x * ((1.0 - t * t) * (0.79788456 + 0.1070322243 * x * x)) + 0.5 * (1.0 + t)


# kind -> (act, dact, gated), float64
REF = {
    A.GELU: (gelu, dgelu),
    A.RELU: (lambda x: np.maximum(x, 0), lambda x: (x > 0).astype(np.float64)),
    A.SILU: (lambda x: x * sigmoid(x), lambda x: sigmoid(x) * (1 + x * (1 - sigmoid(x)))),
    A.QGELU: (
        lambda x: x * sigmoid(1.702 * x),
        lambda x: sigmoid(1.702 * x) * (1 + 1.702 * x * (1 - sigmoid(1.702 * x))),
    ),
    A.SRELU: (lambda x: np.maximum(x, 0) ** 2, lambda x: 2 * np.maximum(x, 0)),
}
GATED = {
    A.GEGLU: A.GELU,
    A.REGLU: A.RELU,
    A.SWIGLU: A.SILU,
    A.QGEGLU: A.QGELU,
    A.SREGLU: A.SRELU,
    A.GLU: None,
}
CLAMPED = A.CLAMPED_SWIGLU
DEFAULTS = (7.0, 1.702, 1.0)  # te_activation_config's (limit, alpha, glu_linear_offset): TE's
KINDS = list(REF) + list(GATED) + [CLAMPED]


def clamped_parts(a, b, params):
    """float64 (act, dact of the clamped activation half, the clamped and offset gate)."""
    limit, alpha, offset = params
    ac = np.minimum(a, limit)
    s = sigmoid(alpha * ac)
    return ac * s, s * (1 + alpha * ac * (1 - s)), np.clip(b, -limit, limit) + offset


def act_pair(kind):
    base = GATED.get(kind, kind)
    if base is None:
        return sigmoid, lambda x: sigmoid(x) * (1 - sigmoid(x))
    return REF[base]


def ref_fwd(x, kind, params=DEFAULTS):
    x = x.astype(np.float64)
    if kind == CLAMPED:
        n = x.shape[-1] // 2
        act, _, gate = clamped_parts(x[..., :n], x[..., n:], params)
        return act * gate
    act, _ = act_pair(kind)
    if kind in GATED:
        n = x.shape[-1] // 2
        return act(x[..., :n]) * x[..., n:]
    return act(x)


def ref_bwd(grad, x, kind, params=DEFAULTS):
    g, x = grad.astype(np.float64), x.astype(np.float64)
    if kind == CLAMPED:  # zero where the clamps hold (the derivative at the bound is kept)
        limit = params[0]
        n = x.shape[-1] // 2
        a, b = x[..., :n], x[..., n:]
        act, dact, gate = clamped_parts(a, b, params)
        da = np.where(a <= limit, g * dact * gate, 0.0)
        db = np.where((b >= -limit) & (b <= limit), g * act, 0.0)
        return np.concatenate([da, db], axis=-1)
    act, dact = act_pair(kind)
    if kind in GATED:
        n = x.shape[-1] // 2
        a, b = x[..., :n], x[..., n:]
        return np.concatenate([g * dact(a) * b, g * act(a)], axis=-1)
    return g * dact(x)


def in_shape(shape, kind):
    return shape[:-1] + (shape[-1] * 2,) if kind in GATED or kind == CLAMPED else shape


def data(shape, dtype, key):
    rng = rng_for("act", shape, dtype_id(dtype), key)
    x = rng.standard_normal(shape) * 3
    x.reshape(-1)[: min(3, x.size)] = [0.0, -0.0, 1e-3][: min(3, x.size)]
    return x.astype(dtype)


def tol(x):
    """fp32 formulas cancel (GELU's 0.5 + 0.5 tanh for x << 0): errors are ulps of |x|-sized terms."""
    return 1e-6 * max(1.0, float(np.abs(x.astype(np.float64)).max(initial=0)) ** 2)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
@pytest.mark.parametrize("out_dtype", HP_TYPES, ids=dtype_id)
@pytest.mark.parametrize("in_dtype", HP_TYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_fwd(shape, in_dtype, out_dtype, kind):
    x = data(in_shape(shape, kind), in_dtype, "fwd")
    y = np.zeros(shape, out_dtype)
    _C.activation_fwd(tensor(x), hp_output(y), int(kind))
    assert_matches_ref(y, ref_fwd(x, kind), f"{kind.name} y", atol=tol(x))


def test_gated_convention_activation_half_first():
    """SWIGLU of [a | b] is silu(a) * b, not a * silu(b)."""
    x = np.array([[2.0, 3.0]], np.float32)  # a = 2, b = 3
    y = np.zeros((1, 1), np.float32)
    _C.activation_fwd(tensor(x), hp_output(y), int(A.SWIGLU))
    np.testing.assert_allclose(y[0, 0], 2 / (1 + np.exp(-2.0)) * 3, rtol=1e-6)
    _C.activation_fwd(tensor(x), hp_output(y), int(A.REGLU))
    assert y[0, 0] == 6.0
    x = np.array([[-2.0, 3.0]], np.float32)
    _C.activation_fwd(tensor(x), hp_output(y), int(A.REGLU))
    assert y[0, 0] == 0.0


def test_relu_propagates_nan():
    x = np.array([np.nan, -1.0, 2.0, -0.0], np.float32)
    y = np.zeros(4, np.float32)
    _C.activation_fwd(tensor(x), hp_output(y), int(A.RELU))
    assert np.isnan(y[0]) and y[1] == 0 and y[2] == 2 and y[3] == 0


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
@pytest.mark.parametrize("dtype", HP_TYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_bwd_with_dbias(shape, dtype, kind):
    x = data(in_shape(shape, kind), dtype, "bwd")
    grad = data(shape, dtype, "grad")
    dx = np.zeros(x.shape, dtype)
    dbias = f32(np.nan, (x.shape[-1],))
    _C.activation_bwd(tensor(grad), tensor(x), hp_output(dx), tensor(dbias), int(kind))
    r = ref_bwd(grad, x, kind)
    t = tol(x) * max(1.0, float(np.abs(grad.astype(np.float64)).max()))
    assert_matches_ref(dx, r, f"{kind.name} dx", atol=t)
    r2 = r.reshape(-1, x.shape[-1])
    # dbias sums the fp32 dx (before rounding to dtype): fp32 summation error over M rows.
    np.testing.assert_allclose(
        dbias, r2.sum(axis=0), rtol=1e-5, atol=t * r2.shape[0] + 1e-6 * np.abs(r2).sum(axis=0).max()
    )


def test_bwd_dbias_is_sum_of_unrounded_dx():
    """With a bf16 dx, dbias is the fp32 sum of the fp32 dx values, i.e. equals the dbias of an
    fp32-dx run bit for bit."""
    x, g = data((129, 40), BF16, "u"), data((129, 40), BF16, "g")
    d1, d2 = f32(0, (40,)), f32(0, (40,))
    _C.activation_bwd(tensor(g), tensor(x), hp_output(np.zeros(x.shape, BF16)), tensor(d1), int(A.GELU))
    _C.activation_bwd(tensor(g), tensor(x), hp_output(np.zeros(x.shape, np.float32)), tensor(d2), int(A.GELU))
    assert_bits_equal(d1, d2, "dbias")


# CLAMPED_SWIGLU parameter sets: TE's defaults, TE's own test values (limit 0.75) with two
# offsets, and no clamp at all (+inf) with another gain.
PARAMS = [DEFAULTS, (0.75, 1.702, 1.0), (0.75, 1.702, 0.0), (2.0, 1.0, -0.5), (np.inf, 1.25, 0.5)]


def act_config(params):
    return _C.ActivationConfig(*params)


@pytest.mark.parametrize("case", ["delayed", "delayed_reset", "current_ct", "block1d"])
@pytest.mark.parametrize("fmt", [O.E4M3, O.E5M2])
@pytest.mark.parametrize("kind", [A.GELU, A.SWIGLU, A.SREGLU, CLAMPED], ids=lambda k: k.name)
@pytest.mark.parametrize("shape", [(1, 1), (7, 13), (129, 257)], ids=str)
def test_quantized(shape, kind, fmt, case):
    # clamped_swiglu with a low limit, so the clamps and the offset both show in the result
    ac = act_config((0.75, 1.702, 0.5)) if kind == CLAMPED else None
    x = data(in_shape(shape, kind), BF16 if shape[0] == 129 else np.float32, "q")
    y32 = np.zeros(shape, np.float32)
    _C.activation_fwd(tensor(x), hp_output(y32), int(kind), act_config=ac)
    q, cfg = make_quantized(case, shape, fmt)
    _C.activation_fwd(tensor(x), q.descriptor(), int(kind), cfg, act_config=ac)
    check_quantized(q, case, y32, fmt, f"fwd {case}")
    # Backward: dx quantized (cast-transpose for the next GEMM) with the fused dbias.
    grad = data(shape, np.float32, "qg")
    dx32, db32 = np.zeros(x.shape, np.float32), f32(0, (x.shape[-1],))
    _C.activation_bwd(tensor(grad), tensor(x), hp_output(dx32), tensor(db32), int(kind), act_config=ac)
    q, cfg = make_quantized(case, x.shape, fmt)
    db = f32(0, (x.shape[-1],))
    _C.activation_bwd(tensor(grad), tensor(x), q.descriptor(), tensor(db), int(kind), cfg, act_config=ac)
    check_quantized(q, case, dx32, fmt, f"bwd {case}")
    assert_bits_equal(db, db32, "dbias with quantized dx")


def clamped_data(shape, dtype, params, key):
    """Values spread over [-3 limit, 3 limit] (a finite limit; else over [-12, 12]), with the
    first row holding both halves exactly at -limit, limit and just inside and outside them."""
    limit = params[0] if np.isfinite(params[0]) else 4.0
    rng = rng_for("clamped", shape, dtype_id(dtype), key, params)
    x = rng.uniform(-3 * limit, 3 * limit, shape)
    edges = [limit, -limit, np.nextafter(np.float32(limit), 0), np.nextafter(np.float32(limit), 99),
             np.nextafter(np.float32(-limit), 0), np.nextafter(np.float32(-limit), -99), 0.0, -0.0]  # fmt: skip
    n = shape[-1] // 2
    k = min(len(edges), n)
    x.reshape(-1, shape[-1])[0, :k] = edges[:k]
    x.reshape(-1, shape[-1])[0, n : n + k] = edges[:k]
    return x.astype(dtype)


@pytest.mark.parametrize("params", PARAMS, ids=str)
@pytest.mark.parametrize("dtype", HP_TYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", [(1, 1), (7, 13), (65, 40)], ids=str)
def test_clamped_swiglu_params(shape, dtype, params):
    """Forward and backward (with dbias) with each parameter set: the activation half clamped
    above at limit, the linear half at +-limit then offset, the gradient zero beyond the clamps."""
    x = clamped_data(in_shape(shape, CLAMPED), dtype, params, "fwd")
    ac = act_config(params)
    y = np.zeros(shape, dtype)
    _C.activation_fwd(tensor(x), hp_output(y), int(CLAMPED), act_config=ac)
    assert_matches_ref(y, ref_fwd(x, CLAMPED, params), "y", atol=tol(x))
    grad = data(shape, dtype, "cg")
    dx = np.zeros(x.shape, dtype)
    dbias = f32(np.nan, (x.shape[-1],))
    _C.activation_bwd(tensor(grad), tensor(x), hp_output(dx), tensor(dbias), int(CLAMPED), act_config=ac)
    r = ref_bwd(grad, x, CLAMPED, params)
    t = tol(x) * max(1.0, float(np.abs(grad.astype(np.float64)).max()))
    assert_matches_ref(dx, r, "dx", atol=t)
    n, x64 = shape[-1], x.astype(np.float64)
    clamped = np.concatenate([x64[..., :n] > params[0], np.abs(x64[..., n:]) > params[0]], axis=-1)
    assert (dx[clamped] == 0).all(), "dx must be exactly 0 where a clamp holds"
    if np.isfinite(params[0]) and shape[-1] > 1:
        assert clamped.any() and (~clamped).any()  # both regions really were exercised
    r2 = r.reshape(-1, x.shape[-1])
    np.testing.assert_allclose(
        dbias, r2.sum(axis=0), rtol=1e-5, atol=t * r2.shape[0] + 1e-6 * np.abs(r2).sum(axis=0).max()
    )


def test_clamped_swiglu_reference_derivative_by_finite_differences():
    """The float64 reference's backward is the derivative of its forward (central differences,
    away from the clamps' kinks), so the tests above do not just repeat one derivation."""
    params = (0.75, 1.702, 0.5)
    rng = np.random.default_rng(5)
    x = rng.uniform(-2.5, 2.5, (16, 20))
    x = np.where(np.abs(np.abs(x) - 0.75) < 1e-3, x + 0.01, x)  # off the kinks
    g = rng.standard_normal((16, 10))
    h = 1e-6
    num = np.zeros_like(x)
    for j in range(x.shape[1]):
        e = np.zeros_like(x)
        e[:, j] = h
        num[:, j] = ((ref_fwd(x + e, CLAMPED, params) - ref_fwd(x - e, CLAMPED, params)) * g).sum(-1) / (
            2 * h
        )
    np.testing.assert_allclose(ref_bwd(g, x, CLAMPED, params), num, rtol=1e-6, atol=1e-8)


def test_clamped_swiglu_values_at_and_beyond_the_limit():
    """Hand-checked elements (limit 7, TE's defaults): a above the limit acts as 7 with zero
    gradient; a == 7 keeps its gradient; b beyond +-7 gates as +-7 (+1) with zero gradient,
    b == -7 keeps it; a is never clamped below."""
    a = np.array([8.0, 7.0, -20.0, 1.0, 1.0, 1.0], np.float32)
    b = np.array([0.0, 0.0, 0.0, 9.0, -7.0, -8.0], np.float32)
    x = np.concatenate([a, b])[None]
    y = np.zeros((1, 6), np.float32)
    _C.activation_fwd(tensor(x), hp_output(y), int(CLAMPED))
    s7 = sigmoid(1.702 * 7.0)
    want = [
        7 * s7,
        7 * s7,
        -20 * sigmoid(-34.04),
        8 * sigmoid(1.702),
        -6 * sigmoid(1.702),
        -6 * sigmoid(1.702),
    ]
    np.testing.assert_allclose(y[0], want, rtol=2e-6, atol=1e-30)
    dx = np.zeros((1, 12), np.float32)
    _C.activation_bwd(tensor(np.ones((1, 6), np.float32)), tensor(x), hp_output(dx), None, int(CLAMPED))
    da, db = dx[0, :6], dx[0, 6:]
    assert da[0] == 0 and da[1] > 0.99 and da[2] != 0  # above: 0; at the limit: s + ...; below: kept
    assert db[3] == 0 and db[5] == 0 and np.isclose(db[4], sigmoid(1.702), rtol=1e-6)  # beyond: 0; at -7: act
    # The defaults are what te_activation_fwd (no config) and an explicit default config give.
    y2 = np.zeros((1, 6), np.float32)
    _C.activation_fwd(tensor(x), hp_output(y2), int(CLAMPED), act_config=_C.ActivationConfig())
    assert_bits_equal(y2, y, "explicit defaults")


def test_clamped_swiglu_without_clamp_or_offset_is_qgeglu():
    """limit +inf, alpha 1.702, offset 0: QGEGLU's formula, operation for operation, so the
    same bits forward and backward."""
    x = data((33, 48), np.float32, "qg") * 4
    ac = act_config((np.inf, 1.702, 0.0))
    y1, y2 = np.zeros((33, 24), np.float32), np.zeros((33, 24), np.float32)
    _C.activation_fwd(tensor(x), hp_output(y1), int(CLAMPED), act_config=ac)
    _C.activation_fwd(tensor(x), hp_output(y2), int(A.QGEGLU))
    assert_bits_equal(y1, y2, "y")
    g = data((33, 24), np.float32, "qgg")
    d1, d2 = np.zeros(x.shape, np.float32), np.zeros(x.shape, np.float32)
    _C.activation_bwd(tensor(g), tensor(x), hp_output(d1), None, int(CLAMPED), act_config=ac)
    _C.activation_bwd(tensor(g), tensor(x), hp_output(d2), None, int(A.QGEGLU))
    assert_bits_equal(d1, d2, "dx")


def test_clamped_swiglu_propagates_nan():
    """A NaN is not clamped: it reaches the output, and the masks count it as inside."""
    x = np.array([[np.nan, 1.0, 2.0, np.nan]], np.float32)  # (a, b) pairs (nan, 2), (1, nan)
    y = np.zeros((1, 2), np.float32)
    _C.activation_fwd(tensor(x), hp_output(y), int(CLAMPED))
    assert np.isnan(y).all()
    dx = np.zeros((1, 4), np.float32)
    _C.activation_bwd(tensor(np.ones((1, 2), np.float32)), tensor(x), hp_output(dx), None, int(CLAMPED))
    assert np.isnan(dx[0, 0]) and np.isnan(dx[0, 2])  # dx[a] at a NaN a; dx[b] of a NaN act
    assert np.isnan(dx[0, 1])  # dx[a] = dact(1) * (NaN gate)
    assert np.isclose(dx[0, 3], sigmoid(1.702), rtol=1e-6)  # dx[b] at a NaN b: g * act(a)


def test_activation_config_is_ignored_by_other_kinds():
    """Every kind but CLAMPED_SWIGLU ignores act_config, even values it would reject."""
    x = data((5, 16), np.float32, "ign")
    bad = _C.ActivationConfig(limit=-1.0, alpha=np.inf)
    for kind in (A.GELU, A.SWIGLU, A.GLU):
        n = 8 if kind != A.GELU else 16
        y1, y2 = np.zeros((5, n), np.float32), np.zeros((5, n), np.float32)
        _C.activation_fwd(tensor(x), hp_output(y1), int(kind))
        _C.activation_fwd(tensor(x), hp_output(y2), int(kind), act_config=bad)
        assert_bits_equal(y2, y1, kind.name)


def raises(exc, text):
    return pytest.raises(exc, match=re.escape(text))


def test_errors():
    x = np.zeros((4, 6), np.float32)
    y = np.zeros((4, 3), np.float32)
    I32 = int(_C.DType.INT32)
    p = "te_activation_fwd: "
    with raises(ValueError, p + "activation: expected a te_activation value (0..4 or 100..106), got 7"):
        _C.activation_fwd(tensor(x), hp_output(y), 7)
    with raises(ValueError, p + "input.dtype: expected float32, float16, bfloat16, got int32"):
        _C.activation_fwd(tensor(x, I32), hp_output(y), int(A.GELU))
    with raises(ValueError, p + "input.ndim: expected >= 1"):
        _C.activation_fwd(tensor(x, shape=[]), hp_output(y), int(A.GELU))
    with raises(
        ValueError,
        p
        + "input.shape: expected an even last dim for a gated activation ([..., 2N]: activation half, then linear half), got [4, 5]",
    ):
        _C.activation_fwd(tensor(np.zeros((4, 5), np.float32)), hp_output(y), int(A.GEGLU))
    with raises(
        ValueError,
        p
        + "output->rowwise_data.shape: expected [4, 3] (or any with the same last dim and element count), got [4, 6]",
    ):
        _C.activation_fwd(tensor(x), hp_output(x), int(A.SWIGLU))
    with raises(ValueError, p + "output->rowwise_data.shape: expected [4, 6]"):
        _C.activation_fwd(tensor(x), hp_output(y), int(A.GELU))
    q, cfg = make_quantized("current_ct", (4, 3), O.E4M3)
    d = q.descriptor()
    d.amax = _C.Tensor(0, 0, [])
    with raises(
        ValueError,
        p
        + "output->amax: current scaling (config->compute_scale = 1) needs an fp32 [1] amax buffer, got NULL",
    ):
        _C.activation_fwd(tensor(x), d, int(A.GLU), cfg)
    q, cfg = make_quantized("block1d", (4, 3), O.E4M3)
    with raises(ValueError, p + "config->use_existing_amax: only meaningful with compute_scale = 1"):
        _C.activation_fwd(tensor(x), q.descriptor(), int(A.GLU), _C.QuantConfig(use_existing_amax=True))
    if _C.cuda_device_count() == 0:  # host memory posing as CUDA: only where no GPU would run it
        # "...but this te-core was built without CUDA" or "...but no CUDA device is usable here"
        with raises(NotImplementedError, p + "input is on cuda:0 but"):
            _C.activation_fwd(
                _C.Tensor(x.ctypes.data, 0, [4, 6], 1, 0),
                _C.QuantizedTensor(0, rowwise_data=_C.Tensor(y.ctypes.data, 0, [4, 6], 1, 0)),
                int(A.GELU),
            )
    p = "te_activation_bwd: "
    dx = np.zeros((4, 6), np.float32)
    with raises(
        ValueError,
        p
        + "grad.shape: expected [4, 3] (the input's shape with the last dim halved: the activation's output), or any with the same last dim and element count, got [4, 6]",
    ):
        _C.activation_bwd(tensor(x), tensor(x), hp_output(dx), None, int(A.SWIGLU))
    with raises(ValueError, p + "grad.shape: expected [4, 6] (the input's shape)"):
        _C.activation_bwd(tensor(y), tensor(x), hp_output(dx), None, int(A.SILU))
    with raises(ValueError, p + "grad.dtype: expected float32, float16, bfloat16, got int32"):
        _C.activation_bwd(tensor(y, I32), tensor(x), hp_output(dx), None, int(A.SWIGLU))
    with raises(ValueError, p + "dx->rowwise_data.shape: expected [4, 6]"):
        _C.activation_bwd(tensor(y), tensor(x), hp_output(y), None, int(A.SWIGLU))
    with raises(ValueError, p + "dbias.shape: expected [6] ([K], the last dim of input), got [3]"):
        _C.activation_bwd(tensor(y), tensor(x), hp_output(dx), tensor(f32(0, (3,))), int(A.SWIGLU))
    with raises(ValueError, p + "dbias.dtype: expected float32, float16, bfloat16, got int32"):
        _C.activation_bwd(tensor(y), tensor(x), hp_output(dx), tensor(f32(0, (6,)), I32), int(A.SWIGLU))
    with raises(ValueError, p + "activation: expected a te_activation value"):
        _C.activation_bwd(tensor(y), tensor(x), hp_output(dx), None, 99)
    q = _C.QuantizedTensor(0, rowwise_data=tensor(dx))
    q.struct_size = 8
    with raises(ValueError, p + "dx->struct_size: expected at least"):
        _C.activation_bwd(tensor(y), tensor(x), q, None, int(A.SWIGLU))


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"limit": 0.0}, "act_config->limit: expected a value > 0 (the clamp bound; +inf: no clamp), got 0"),
        (
            {"limit": -7.0},
            "act_config->limit: expected a value > 0 (the clamp bound; +inf: no clamp), got -7",
        ),
        ({"limit": np.nan}, "act_config->limit: expected a value > 0"),
        ({"alpha": np.inf}, "act_config->alpha: expected a finite value, got inf"),
        ({"glu_linear_offset": np.nan}, "act_config->glu_linear_offset: expected a finite value, got nan"),
        ({"struct_size": 12}, "act_config->struct_size: expected at least 16"),
    ],
)
def test_activation_config_errors(fields, message):
    x = np.zeros((4, 6), np.float32)
    ac = _C.ActivationConfig()
    for k, v in fields.items():
        setattr(ac, k, v)
    with raises(ValueError, "te_activation_fwd_v2: " + message):
        _C.activation_fwd(tensor(x), hp_output(np.zeros((4, 3), np.float32)), int(CLAMPED), act_config=ac)
    with raises(ValueError, "te_activation_bwd_v2: " + message):
        _C.activation_bwd(
            tensor(np.zeros((4, 3), np.float32)), tensor(x), hp_output(np.zeros((4, 6), np.float32)), None,
            int(CLAMPED), act_config=ac,
        )  # fmt: skip
