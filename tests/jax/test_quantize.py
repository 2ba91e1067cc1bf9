"""te_jax.quantize / ScaledTensor.dequantize on the CPU backend, against the numpy/ml_dtypes
oracle in _jax_oracle.py (NUMERICS.md written out independently).

Run: PYTHONPATH=packages/te-core/src:packages/te-jax/src pytest tests/jax
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import _jax_oracle as oracle
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import te_jax
from te_jax import _quantize

E4M3, E5M2 = jnp.float8_e4m3fn, jnp.float8_e5m2
SOURCES = [jnp.float32, jnp.bfloat16, jnp.float16]
SHAPES = [(1, 1), (7, 13), (1000, 3), (4, 5, 6), (129, 257)]


def _np(a) -> np.ndarray:
    return np.asarray(jax.device_get(a))


def _x(shape, dtype, seed=0):
    x = oracle.random_source(np.random.default_rng(seed), shape, np.float32)
    if dtype == jnp.float16:  # keep fp16 finite: its max is 65504
        x = np.clip(x, -6e4, 6e4)
    x = jnp.asarray(x, dtype)
    return x, _np(x.astype(jnp.float32))


def _assert_bits(actual, expected):
    actual, expected = _np(actual), np.asarray(expected)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    a, e = oracle.bits(actual), oracle.bits(expected)
    bad = np.argwhere(a != e)
    assert bad.size == 0, (
        f"{len(bad)} of {a.size} differ; first at {tuple(bad[0])}: "
        f"got {actual[tuple(bad[0])]}, expected {expected[tuple(bad[0])]}"
    )


def _block_1d_valid(sinv, m):
    """The written part of a block_1d scale_inv [ceil(K/128), roundup(M, 4)]: te never writes
    the padding, so it holds whatever the buffer held."""
    return _np(sinv)[:, :m]


def _block_2d_valid(sinv, kb):
    return _np(sinv)[:, :kb]


def _matrix_dims(shape):
    k = shape[-1]
    return math.prod(shape) // k, k


# --- per-tensor, current scaling -----------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("src", SOURCES)
@pytest.mark.parametrize("fp8", [E4M3, E5M2])
def test_per_tensor_current_matches_oracle(shape, src, fp8):
    x, x32 = _x(shape, src)
    q = te_jax.quantize(x, dtype=fp8)
    q_ref, scale, sinv, amax = oracle.per_tensor(x32, fp8)
    _assert_bits(q.data, q_ref)
    assert q.data.shape == shape and q.data.dtype == fp8
    assert _np(q.amax).tolist() == [amax]
    assert _np(q.scale).tolist() == [scale]
    assert _np(q.scale_inv).tolist() == [sinv]
    assert q.columnwise_data is None and q.columnwise_scale_inv is None
    assert q.shape == shape and q.dq_dtype == np.dtype(src) and q.scaling_mode == "per_tensor"


def test_per_tensor_scale_rule_pow2_and_epsilon():
    x = jnp.asarray([[3.0, -1.0, 0.5]], jnp.float32)
    q = te_jax.quantize(x)
    assert _np(q.scale).tolist() == [np.float32(448.0) / np.float32(3.0)]
    q = te_jax.quantize(x, force_pow2_scales=True)
    assert _np(q.scale).tolist() == [128.0]  # 149.33 rounded down to a power of two
    # epsilon bounds the amax from below for the scale; the amax result stays amax(x)
    q = te_jax.quantize(x * 1e-6, amax_epsilon=0.5)
    assert _np(q.scale).tolist() == [896.0]
    assert _np(q.amax).tolist() == [np.float32(3e-6)]
    q = te_jax.quantize(x, amax_epsilon=0.5)
    assert _np(q.scale).tolist() == [np.float32(448.0) / np.float32(3.0)]
    # amax 0 -> scale 1; E5M2
    q = te_jax.quantize(jnp.zeros((3, 4)), dtype=E5M2)
    assert _np(q.scale).tolist() == [1.0] and _np(q.amax).tolist() == [0.0]
    assert _np(q.scale_inv).tolist() == [1.0]
    q = te_jax.quantize(x, dtype=E5M2)
    assert _np(q.scale).tolist() == [np.float32(57344.0) / np.float32(3.0)]
    # a tiny amax overflows the division: FLT_MAX
    q = te_jax.quantize(jnp.full((2, 2), 1e-40, jnp.float32))
    assert _np(q.scale).tolist() == [oracle.FLT_MAX]


def test_per_tensor_nan_propagates_into_amax_and_scale_is_one():
    x = jnp.asarray([[1.0, np.nan, -2.0, 500.0]], jnp.float32)
    q = te_jax.quantize(x)
    assert np.isnan(_np(q.amax)[0])
    assert _np(q.scale).tolist() == [1.0]
    d = _np(q.data).astype(np.float32)
    assert np.isnan(d[0, 1]) and d[0, 0] == 1.0 and d[0, 2] == -2.0 and d[0, 3] == 448.0


def test_special_values_saturate_and_round_to_nearest_even():
    m = 448.0
    vals = [
        0.0,
        -0.0,
        m,
        -m,
        464.0,
        480.0,
        1e9,
        -np.inf,
        np.inf,
        np.nan,
        2.0**-9,
        2.0**-10,
        3 * 2.0**-10,
        1.0625,
        1.1875,
        17.0,
        19.0,
    ]
    x = jnp.asarray([vals], jnp.float32)
    q = te_jax.quantize(x, scale=jnp.ones((1,)))
    got = _np(q.data).astype(np.float32)[0]
    expected = [0.0, -0.0, m, -m, m, m, m, -m, m, np.nan, 2.0**-9, 0.0, 2.0**-8, 1.0, 1.25, 16.0, 20.0]
    np.testing.assert_array_equal(got, np.asarray(expected, np.float32))
    _assert_bits(q.data[:, :9], oracle.cast(_np(x)[:, :9], 1.0, E4M3))


def test_fp32_subnormals_are_ieee_inside_xla():
    # XLA's CPU threads flush denormals; te's CPU handlers must not (the reference backend).
    tiny = np.float32(1e-40)
    x = jnp.asarray(np.array([[tiny, -tiny, 1e-39]], np.float32))
    assert _np(_quantize.amax(x)).tolist() == [np.float32(1e-39)]
    scale = np.float32(2.0**126)
    q = te_jax.quantize(x, scale=jnp.asarray([scale]))
    _assert_bits(q.data, oracle.cast(_np(x), scale, E4M3))
    assert _np(q.data).astype(np.float32)[0, 0] > 0
    q = te_jax.quantize(x)
    assert _np(q.amax).tolist() == [np.float32(1e-39)]
    assert _np(q.scale).tolist() == [oracle.FLT_MAX]


# --- per-tensor, delayed scaling -----------------------------------------------------------------


@pytest.mark.parametrize("src", SOURCES)
@pytest.mark.parametrize("fp8", [E4M3, E5M2])
def test_per_tensor_delayed_matches_oracle(src, fp8):
    x, x32 = _x((33, 65), src, seed=3)
    scale = np.float32(0.37)
    q = te_jax.quantize(x, dtype=fp8, scale=jnp.asarray([scale]))
    q_ref, _, sinv, amax = oracle.per_tensor(x32, fp8, scale=scale)
    _assert_bits(q.data, q_ref)
    assert _np(q.scale).tolist() == [scale]
    assert _np(q.scale_inv).tolist() == [sinv]
    assert _np(q.amax).tolist() == [amax]  # default running amax is zeros


def test_delayed_amax_max_accumulates_through_the_alias():
    x = jnp.asarray([[1.0, -4.0], [2.0, 3.0]], jnp.float32)
    scale = jnp.asarray([2.0], jnp.float32)
    running = jnp.asarray([10.0], jnp.float32)
    q = te_jax.quantize(x, scale=scale, amax=running)
    assert _np(q.amax).tolist() == [10.0]
    assert _np(running).tolist() == [10.0]  # the caller's array is untouched (functional)
    q = te_jax.quantize(x, scale=scale, amax=jnp.asarray([0.5]))
    assert _np(q.amax).tolist() == [4.0]
    assert _np(q.scale).tolist() == [2.0] and _np(q.scale_inv).tolist() == [0.5]
    # NaN in the running amax stays NaN
    q = te_jax.quantize(x, scale=scale, amax=jnp.asarray([np.nan]))
    assert np.isnan(_np(q.amax)[0])

    # A step loop under jit, the running amax carried and donated: every quantization of the
    # step lands in the same slot.
    @jax.jit
    def step(running, xs):
        for xi in xs:
            running = te_jax.quantize(xi, scale=scale, amax=running).amax
        return running

    xs = [x * 0.5, x * 3.0, x]
    assert _np(step(jnp.zeros((1,)), xs)).tolist() == [12.0]
    donated = jax.jit(step, donate_argnums=0)
    assert _np(donated(jnp.asarray([20.0]), xs)).tolist() == [20.0]
    # scale and amax given as scalars / shape ()
    q = te_jax.quantize(x, scale=2.0, amax=jnp.float32(7.0))
    assert _np(q.amax).tolist() == [7.0] and _np(q.scale).tolist() == [2.0]


# --- column-wise copies --------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
def test_per_tensor_columnwise_is_the_transpose(shape):
    x, x32 = _x(shape, jnp.bfloat16, seed=5)
    q = te_jax.quantize(x, rowwise=True, columnwise=True)
    m, k = _matrix_dims(shape)
    assert q.columnwise_data.shape == (k, m)
    _assert_bits(q.columnwise_data, _np(q.data).reshape(m, k).T)
    assert _np(q.columnwise_scale_inv).tolist() == _np(q.scale_inv).tolist()
    qc = te_jax.quantize(x, rowwise=False, columnwise=True)
    assert qc.data is None and qc.scale_inv is None
    _assert_bits(qc.columnwise_data, _np(q.columnwise_data))
    assert _np(qc.amax).tolist() == _np(q.amax).tolist()


# --- block scaling -------------------------------------------------------------------------------

BLOCK_SHAPES = [(1, 1), (7, 13), (1000, 3), (4, 5, 6), (129, 257), (256, 384), (2, 130, 129)]


@pytest.mark.parametrize("shape", BLOCK_SHAPES)
@pytest.mark.parametrize("src", SOURCES)
@pytest.mark.parametrize("fp8", [E4M3, E5M2])
def test_block_1d_matches_oracle(shape, src, fp8):
    x, x32 = _x(shape, src, seed=7)
    q = te_jax.quantize(x, dtype=fp8, scaling_mode="block_1d", columnwise=True)
    m, k = _matrix_dims(shape)
    q_ref, sinv_ref = oracle.block_1d(x32, fp8)
    _assert_bits(_np(q.data).reshape(m, k), q_ref)
    assert q.scale_inv.shape == (math.ceil(k / 128), -(-m // 4) * 4)
    np.testing.assert_array_equal(_block_1d_valid(q.scale_inv, m), sinv_ref)
    assert q.amax is None and q.scale is None
    # column-wise: the 1x128 quantization of x.T, i.e. 128-long blocks down x's columns
    qt_ref, sinvt_ref = oracle.block_1d(oracle.as_matrix(x32).T, fp8)
    assert q.columnwise_data.shape == (k, m)
    _assert_bits(q.columnwise_data, qt_ref)
    np.testing.assert_array_equal(_block_1d_valid(q.columnwise_scale_inv, k), sinvt_ref)
    # and it is the same as quantizing x.T row-wise through te_jax
    qt = te_jax.quantize(
        jnp.asarray(oracle.as_matrix(x32).T, src) if src == jnp.float32 else x.reshape(m, k).T,
        dtype=fp8,
        scaling_mode="block_1d",
    )
    _assert_bits(q.columnwise_data, _np(qt.data))


@pytest.mark.parametrize("shape", BLOCK_SHAPES)
@pytest.mark.parametrize("src", SOURCES)
def test_block_2d_matches_oracle(shape, src):
    x, x32 = _x(shape, src, seed=11)
    q = te_jax.quantize(x, scaling_mode="block_2d", columnwise=True)
    m, k = _matrix_dims(shape)
    mb, kb = math.ceil(m / 128), math.ceil(k / 128)
    q_ref, sinv_ref = oracle.block_2d(x32, E4M3)
    _assert_bits(_np(q.data).reshape(m, k), q_ref)
    assert q.scale_inv.shape == (mb, -(-kb // 4) * 4)
    np.testing.assert_array_equal(_block_2d_valid(q.scale_inv, kb), sinv_ref)
    # column-wise: the transposed data, the transposed tile scales
    _assert_bits(q.columnwise_data, q_ref.T)
    assert q.columnwise_scale_inv.shape == (kb, -(-mb // 4) * 4)
    np.testing.assert_array_equal(_block_2d_valid(q.columnwise_scale_inv, mb), sinv_ref.T)


def test_block_scales_pow2_by_default_and_f32_on_request():
    x = jnp.asarray(np.full((1, 128), 3.0, np.float32))
    q = te_jax.quantize(x, scaling_mode="block_1d")
    assert _np(q.scale_inv)[0, 0] == 1.0 / 128.0
    q = te_jax.quantize(x, scaling_mode="block_1d", force_pow2_scales=False)
    assert _np(q.scale_inv)[0, 0] == np.float32(1.0) / (np.float32(448.0) / np.float32(3.0))
    q = te_jax.quantize(x * 0, scaling_mode="block_2d", amax_epsilon=1.75)
    assert _np(q.scale_inv)[0, 0] == 1.0 / 256.0  # 448 / 1.75 = 256


# --- dequantize ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["per_tensor", "block_1d", "block_2d"])
@pytest.mark.parametrize("src", SOURCES)
@pytest.mark.parametrize("shape", [(7, 13), (4, 5, 6), (129, 257)])
def test_dequantize_matches_oracle(mode, src, shape):
    x, x32 = _x(shape, src, seed=13)
    q = te_jax.quantize(x, scaling_mode=mode, columnwise=True)
    m, k = _matrix_dims(shape)
    data = _np(q.data).reshape(m, k).astype(np.float32)
    if mode == "per_tensor":
        sinv = np.full((m, k), _np(q.scale_inv)[0], np.float32)
    elif mode == "block_1d":
        sinv = np.repeat(_block_1d_valid(q.scale_inv, m).T, 128, axis=1)[:, :k]
    else:
        s = _block_2d_valid(q.scale_inv, math.ceil(k / 128))
        sinv = np.repeat(np.repeat(s, 128, axis=0), 128, axis=1)[:m, :k]
    for dt in [None, jnp.float32, jnp.bfloat16, jnp.float16]:
        out_dt = np.dtype(src) if dt is None else np.dtype(dt)
        expected = (data * sinv).astype(out_dt).reshape(shape)
        y = q.dequantize(dt)
        assert y.dtype == out_dt and y.shape == shape
        np.testing.assert_array_equal(_np(y).astype(np.float32), expected.astype(np.float32))
    # from the column-wise copy alone: the same values, transposed back
    qc = te_jax.quantize(x, scaling_mode=mode, rowwise=False, columnwise=True)
    np.testing.assert_array_equal(
        _np(qc.dequantize(jnp.float32)),
        _np(q.dequantize(jnp.float32)) if mode != "block_1d" else _np(qc.dequantize(jnp.float32)),
    )
    if mode == "block_1d":  # column-wise blocks differ from row-wise ones: check it against x.T's
        qt = te_jax.quantize(x.reshape(m, k).T, scaling_mode=mode)
        np.testing.assert_array_equal(
            _np(qc.dequantize(jnp.float32)).reshape(m, k), _np(qt.dequantize(jnp.float32)).T
        )
    # quantization error is bounded by half an fp8 ulp (3 mantissa bits -> 2^-4 relative)
    y = _np(q.dequantize(jnp.float32))
    assert np.all(np.abs(y - x32) <= np.abs(x32) * 2.0**-4 + np.abs(sinv.reshape(shape)) * 2.0**-9 + 1e-30)


# --- te's amax and transpose ops -----------------------------------------------------------------


def test_amax_and_transpose_ops():
    x, x32 = _x((37, 300), jnp.bfloat16)
    assert _np(_quantize.amax(x)).tolist() == [oracle.amax(x32)]
    assert np.isnan(_np(_quantize.amax(jnp.asarray([1.0, np.nan])))[0])
    q = te_jax.quantize(x)
    _assert_bits(_quantize.transpose(q.data), _np(q.data).T)
    np.testing.assert_array_equal(_np(_quantize.transpose(x)), _np(x).T)
    y = jnp.arange(24, dtype=jnp.float32).reshape(2, 3, 4)
    np.testing.assert_array_equal(_np(_quantize.transpose(y)), np.arange(24).reshape(6, 4).T)


# --- jit, vmap, pytree ---------------------------------------------------------------------------


def _valid_parts(q: te_jax.ScaledTensor):
    m, k = _matrix_dims(q.shape)
    out = []
    for name in ["data", "scale_inv", "columnwise_data", "columnwise_scale_inv", "amax", "scale"]:
        v = getattr(q, name)
        if v is None:
            out.append(None)
            continue
        v = _np(v)
        if name == "scale_inv" and q.scaling_mode == "block_1d":
            v = v[:, :m]
        elif name == "columnwise_scale_inv" and q.scaling_mode == "block_1d":
            v = v[:, :k]
        elif name == "scale_inv" and q.scaling_mode == "block_2d":
            v = v[:, : math.ceil(k / 128)]
        elif name == "columnwise_scale_inv" and q.scaling_mode == "block_2d":
            v = v[:, : math.ceil(m / 128)]
        out.append(oracle.bits(v) if v.dtype.itemsize == 1 else v)
    return out


@pytest.mark.parametrize("mode", ["per_tensor", "block_1d", "block_2d"])
def test_jit_and_eager_and_disable_jit_agree(mode):
    x, _ = _x((130, 200), jnp.bfloat16, seed=17)
    kw = dict(scaling_mode=mode, columnwise=True)
    eager = te_jax.quantize(x, **kw)
    jitted = jax.jit(lambda x: te_jax.quantize(x, **kw))(x)
    with jax.disable_jit():
        nojit = te_jax.quantize(x, **kw)
    for a, b, c in zip(_valid_parts(eager), _valid_parts(jitted), _valid_parts(nojit), strict=True):
        if a is None:
            assert b is None and c is None
        else:
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(a, c)
    np.testing.assert_array_equal(_np(jax.jit(lambda q: q.dequantize())(eager)), _np(eager.dequantize()))


def test_scaled_tensor_is_a_pytree():
    x, _ = _x((8, 16), jnp.float32)
    q = te_jax.quantize(x, columnwise=True)
    leaves, treedef = jax.tree_util.tree_flatten(q)
    assert len(leaves) == 6  # data, scale_inv, columnwise_data, columnwise_scale_inv, amax, scale
    q2 = jax.tree_util.tree_unflatten(treedef, leaves)
    assert q2.scaling_mode == "per_tensor" and q2.fp8_dtype == np.dtype(E4M3)
    qb = te_jax.quantize(x, scaling_mode="block_1d")
    assert len(jax.tree_util.tree_leaves(qb)) == 2  # absent parts are None, not leaves
    out = jax.jit(lambda q: q)(q)
    assert isinstance(out, te_jax.ScaledTensor)


def test_vmap_quantizes_each_element_with_its_own_scale():
    x, _ = _x((3, 7, 13), jnp.float32, seed=19)
    batched = jax.vmap(lambda xi: te_jax.quantize(xi))(x)
    for i in range(3):
        qi = te_jax.quantize(x[i])
        _assert_bits(batched.data[i], _np(qi.data))
        assert _np(batched.scale)[i].tolist() == _np(qi.scale).tolist()


# --- errors --------------------------------------------------------------------------------------


def test_errors_name_the_argument_and_accepted_values():
    x = jnp.ones((4, 4), jnp.float32)
    with pytest.raises(
        TypeError,
        match=r"x: expected one of jnp.float32, jnp.float16, "
        r"jnp.bfloat16, got int32",
    ):
        te_jax.quantize(jnp.ones((4, 4), jnp.int32))
    with pytest.raises(
        TypeError,
        match=r"dtype: expected one of jnp.float8_e4m3fn, "
        r"jnp.float8_e5m2, got int8",
    ):
        te_jax.quantize(x, dtype=jnp.int8)
    with pytest.raises(TypeError, match=r"dtype: expected one of .*, got 'fp8'"):
        te_jax.quantize(x, dtype="fp8")
    with pytest.raises(
        ValueError,
        match=r"scaling_mode: expected one of 'per_tensor', "
        r"'block_1d', 'block_2d', 'mxfp8_1d', 'nvfp4_1d', got 'mxfp8'",
    ):
        te_jax.quantize(x, scaling_mode="mxfp8")
    with pytest.raises(ValueError, match=r"scale: expected shape \(1,\) or \(\) .*got \(2,\)"):
        te_jax.quantize(x, scale=jnp.ones((2,)))
    with pytest.raises(ValueError, match=r"amax: expected shape \(1,\) or \(\) .*got \(1, 1\)"):
        te_jax.quantize(x, scale=jnp.ones((1,)), amax=jnp.ones((1, 1)))
    with pytest.raises(TypeError, match=r"scale: expected a floating array .*got int32"):
        te_jax.quantize(x, scale=jnp.ones((1,), jnp.int32))
    with pytest.raises(
        ValueError,
        match=r"scale: scaling_mode 'block_1d' computes a scale per "
        r"block; expected scale=None",
    ):
        te_jax.quantize(x, scaling_mode="block_1d", scale=jnp.ones((1,)))
    with pytest.raises(ValueError, match=r"amax: expected None without a scale"):
        te_jax.quantize(x, amax=jnp.zeros((1,)))
    with pytest.raises(ValueError, match=r"rowwise, columnwise: expected at least one"):
        te_jax.quantize(x, rowwise=False)
    with pytest.raises(ValueError, match=r"amax_epsilon: expected a float >= 0, got -1.0"):
        te_jax.quantize(x, amax_epsilon=-1.0)
    with pytest.raises(TypeError, match=r"amax_epsilon: expected a Python float"):
        jax.jit(lambda x, e: te_jax.quantize(x, amax_epsilon=e))(x, 0.5)
    with pytest.raises(TypeError, match=r"force_pow2_scales: expected True or False"):
        te_jax.quantize(x, force_pow2_scales=1)
    with pytest.raises(
        TypeError,
        match=r"dtype: expected one of jnp.float32, jnp.float16, "
        r"jnp.bfloat16, got float8_e4m3fn",
    ):
        te_jax.quantize(x).dequantize(E4M3)
    # a shape the C API refuses comes back as its ValueError, at trace time
    with pytest.raises(ValueError, match=r"dims"):
        te_jax.quantize(jnp.ones((1,) * 9))
    # errors are raised while tracing, before anything runs
    with pytest.raises(TypeError, match=r"dtype:"):
        jax.jit(lambda x: te_jax.quantize(x, dtype=jnp.float16)).lower(x)


def test_ffi_errors_carry_te_last_error():
    # A call the Python layer does not check (a hand-made op with a wrong result shape) reaches
    # te-core, whose message comes back through the FFI error, not as a crash.
    from te_core import _ops
    from te_jax import _ffi

    x = jnp.ones((4, 4), jnp.float32)
    with pytest.raises(
        jax.errors.JaxRuntimeError,
        match=r"INVALID_ARGUMENT: te_amax: amax.shape: expected 1 element, got \[2\]",
    ):
        _ffi.call(_ffi.AMAX, [_ops.TensorSpec((2,), _ops.FLOAT32)], x)[0].block_until_ready()
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"te_transpose: output"):
        jax.jit(lambda x: _ffi.call(_ffi.TRANSPOSE, [_ops.TensorSpec((3, 4), _ops.FLOAT32)], x)[0])(
            x
        ).block_until_ready()


# --- packaging -----------------------------------------------------------------------------------


def test_importing_te_jax_does_not_import_torch():
    # nor flax: te_jax.flax (which needs it) is imported on first use
    code = (
        "import sys, jax.numpy as jnp, te_jax\n"
        "te_jax.quantize(jnp.ones((4, 4))).dequantize().block_until_ready()\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'flax'))\n"
        "assert not bad, bad\n"
        "assert te_jax.flax.LayerNormMLP is not None and 'flax' in sys.modules\n"
        "print('ok', sorted(te_jax.__all__))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ), timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (
        "ok ['MeshResource', 'ScaledTensor', '__version__', 'activation', 'attention', 'autocast', 'dense', "
        "'fp8_autocast', "
        "'gemm', 'get_autocast_state', 'init_recipe_state', 'layernorm', 'layernorm_dense', 'layernorm_mlp', "
        "'quantize', 'recipe', 'update_collections']"
    )


def test_public_surface():
    assert te_jax.__version__ == "0.1.0"
    assert te_jax.recipe.DelayedScaling is not None
    assert set(te_jax.__all__) == {
        "__version__",
        "recipe",
        "attention",
        "quantize",
        "gemm",
        "ScaledTensor",
        "dense",
        "layernorm",
        "activation",
        "layernorm_dense",
        "layernorm_mlp",
        "autocast",
        "fp8_autocast",
        "get_autocast_state",
        "MeshResource",
        "init_recipe_state",
        "update_collections",
    }
