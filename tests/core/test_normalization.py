"""LayerNorm / RMSNorm (te/normalization.h) on the CPU backend against an independent float64
reference, fused FP8 outputs against "norm in fp32, then te_quantize" and the oracle quantizer,
and every error path.

Backward formulas (derived for one row of H, y = xhat * g + b, xhat = (x - mu) * rsigma):
  dxhat = dy * g
  LayerNorm: d xhat_j / d x_i = rsigma * (delta_ij - 1/H - xhat_i xhat_j / H), so
             dx = rsigma * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
  RMSNorm:   xhat = x * rsigma, rsigma = (mean(x^2) + eps)^-1/2, d rsigma / d x_i = -rsigma^3 x_i / H:
             dx = rsigma * (dxhat - xhat * mean(dxhat * xhat))
  dgamma = sum over rows of dy * xhat, dbeta = sum over rows of dy (same with zero_centered_gamma,
  since g = 1 + gamma has d g / d gamma = 1).
"""

import re

import _oracle as O
import numpy as np
import pytest
from _buffers import Quantized, assert_bits_equal, f32, rng_for, tensor
from _fused import BF16, HP_TYPES, assert_matches_ref, check_quantized, dtype_id, hp_output, make_quantized
from te_core import _C

SHAPES = [(1, 1), (7, 13), (129, 257), (2, 3, 17)]
EPS = 1e-5


def inputs(shape, dtype, key):
    rng = rng_for("norm", shape, dtype_id(dtype), key)
    h = shape[-1]
    x = (rng.standard_normal(shape) * rng.uniform(0.5, 2.0) + rng.uniform(-1, 1)).astype(dtype)
    gamma = (rng.standard_normal(h) * 0.3 + 0.5).astype(dtype)
    beta = (rng.standard_normal(h) * 0.2).astype(dtype)
    return x, gamma, beta


def f64(a):
    return np.asarray(a).astype(np.float64)


def ref_fwd(x, gamma, beta, rms, zcg, eps=EPS):
    h = x.shape[-1]
    x2 = f64(x).reshape(-1, h)
    g = f64(gamma) + (1.0 if zcg else 0.0)
    mu = np.zeros(x2.shape[0]) if rms else x2.mean(axis=1)
    var = ((x2 - mu[:, None]) ** 2).mean(axis=1)
    rsigma = 1.0 / np.sqrt(var + np.float64(np.float32(eps)))
    y = (x2 - mu[:, None]) * rsigma[:, None] * g
    if beta is not None:
        y = y + f64(beta)
    return y.reshape(x.shape), mu, rsigma


def run_fwd(x, gamma, beta, output, rms, zcg=False, eps=EPS, quant_config=None, stats=True):
    rows, _ = O.matrix_dims(x.shape)
    mu, rsigma = f32(np.nan, (rows,)), f32(np.nan, (rows,))
    cfg = _C.NormConfig(eps=eps, zero_centered_gamma=zcg)
    if rms:
        _C.rmsnorm_fwd(tensor(x), tensor(gamma), output, tensor(rsigma) if stats else None, cfg, quant_config)
    else:
        _C.layernorm_fwd(
            tensor(x),
            tensor(gamma),
            None if beta is None else tensor(beta),
            output,
            tensor(mu) if stats else None,
            tensor(rsigma) if stats else None,
            cfg,
            quant_config,
        )
    return mu, rsigma


@pytest.mark.parametrize("zcg", [False, True], ids=["gamma", "zero_centered"])
@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("out_dtype", HP_TYPES, ids=dtype_id)
@pytest.mark.parametrize("in_dtype", HP_TYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_fwd_high_precision(shape, in_dtype, out_dtype, rms, zcg):
    x, gamma, beta = inputs(shape, in_dtype, "fwd")
    y = np.zeros(shape, out_dtype)
    mu, rsigma = run_fwd(x, gamma, beta, hp_output(y), rms, zcg)
    ry, rmu, rrs = ref_fwd(x, gamma, None if rms else beta, rms, zcg)
    assert_matches_ref(y, ry, "y")
    if not rms:
        np.testing.assert_allclose(mu, rmu, rtol=1e-6, atol=1e-6 * np.abs(f64(x)).max())
    else:
        assert np.isnan(mu).all(), "RMSNorm has no mu"
    np.testing.assert_allclose(rsigma, rrs, rtol=1e-6)


@pytest.mark.parametrize("h", [8000, 16384])
@pytest.mark.parametrize("kind", ["offset", "outlier_first"])
@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
def test_stats_of_rows_that_defeat_fp32_sums(h, kind, rms):
    """Rows whose mean dwarfs their spread (100 +- 4) or whose first element does (3000 beside
    N(0, 1) values): summed in index order in fp32, every later term of such a row is rounded to
    the huge partial sum's ulp and rsigma came out up to 4e-5 off float64; the reference's sums
    must stay as accurate as the CUDA kernels' tree sums it checks."""
    rng = rng_for("norm-defeat", h, kind)
    if kind == "offset":
        x = (rng.standard_normal((5, h)) * 4.0 + 100.0).astype(np.float32)
    else:
        x = rng.standard_normal((5, h)).astype(np.float32)
        x[:, 0] = 3000.0
    gamma = np.ones(h, np.float32)
    y = np.zeros_like(x)
    mu, rsigma = run_fwd(x, gamma, None, hp_output(y), rms)
    _, rmu, rrs = ref_fwd(x, gamma, None, rms, False)
    np.testing.assert_allclose(rsigma, rrs, rtol=1e-6)
    if not rms:
        np.testing.assert_allclose(mu, rmu, rtol=1e-6)


def test_rsigma_is_one_over_correctly_rounded_sqrt():
    """rsigma = 1.0f / sqrtf(var + eps), each step correctly rounded in fp32 (not rsqrt)."""
    x = np.array([[1.0, 2.0, 4.0, 7.0]], np.float32)
    y = np.zeros_like(x)
    _, rsigma = run_fwd(x, np.ones(4, np.float32), None, hp_output(y), rms=True, eps=0.1)
    ms = np.float32(np.float32(1 + 4 + 16 + 49) / np.float32(4))
    want = np.float32(1.0) / np.sqrt(ms + np.float32(0.1))
    assert_bits_equal(rsigma, np.array([want], np.float32), "rsigma")


def test_layernorm_without_beta_and_without_stats():
    x, gamma, _ = inputs((7, 13), np.float32, "nobeta")
    y = np.zeros_like(x)
    mu, rsigma = run_fwd(x, gamma, None, hp_output(y), rms=False, stats=False)
    assert np.isnan(mu).all() and np.isnan(rsigma).all(), "absent mu/rsigma were written"
    assert_matches_ref(y, ref_fwd(x, gamma, None, False, False)[0], "y (no beta)")


@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
def test_zero_centered_gamma_is_one_plus_gamma(rms):
    """zero_centered_gamma with gamma gives the same bits as plain gamma' = 1 + gamma (fp32)."""
    x, gamma, beta = inputs((7, 13), np.float32, "zcg")
    y1, y2 = np.zeros_like(x), np.zeros_like(x)
    run_fwd(x, gamma, beta, hp_output(y1), rms, zcg=True)
    run_fwd(x, (np.float32(1) + gamma).astype(np.float32), beta, hp_output(y2), rms, zcg=False)
    assert_bits_equal(y1, y2, "zero-centered vs 1 + gamma")
    assert not np.array_equal(y1, np.zeros_like(x))


def test_empty_rows():
    x = np.zeros((0, 5), np.float32)
    y = np.zeros((0, 5), np.float32)
    run_fwd(x, np.ones(5, np.float32), np.zeros(5, np.float32), hp_output(y), rms=False)


@pytest.mark.parametrize(
    "case",
    ["delayed", "delayed_ct", "delayed_reset", "current_ct", "current_colonly", "block1d", "block1d_fp32"],
)
@pytest.mark.parametrize("fmt", [O.E4M3, O.E5M2])
@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("shape", [(1, 1), (7, 13), (129, 257), (2, 3, 130)], ids=str)
def test_fwd_quantized(shape, rms, fmt, case):
    in_dtype = BF16 if shape[0] == 129 else np.float32
    x, gamma, beta = inputs(shape, in_dtype, "quant")
    y32 = np.zeros(shape, np.float32)
    mu32, rs32 = run_fwd(x, gamma, beta, hp_output(y32), rms, zcg=True)
    q, cfg = make_quantized(case, shape, fmt)
    mu, rs = run_fwd(x, gamma, beta, q.descriptor(), rms, zcg=True, quant_config=cfg)
    assert_bits_equal(rs, rs32, "rsigma")
    assert_bits_equal(mu, mu32, "mu")
    check_quantized(q, case, y32, fmt, f"{case} {fmt}")


# ---- backward -------------------------------------------------------------------------------


def ref_bwd(dz, x, mu, rsigma, gamma, rms, zcg, add=None):
    h = x.shape[-1]
    dy, x2 = f64(dz).reshape(-1, h), f64(x).reshape(-1, h)
    mu = np.zeros(x2.shape[0]) if rms else f64(mu)
    rs = f64(rsigma)[:, None]
    g = f64(gamma) + (1.0 if zcg else 0.0)
    xhat = (x2 - mu[:, None]) * rs
    dxhat = dy * g
    proj = (dxhat * xhat).mean(axis=1, keepdims=True)
    center = 0.0 if rms else dxhat.mean(axis=1, keepdims=True)
    dx = rs * (dxhat - center - xhat * proj)
    if add is not None:
        dx = dx + f64(add).reshape(-1, h)
    # The size of the terms dx is a difference of: its fp32 error is relative to this, not to dx.
    terms = float(np.abs(rs * dxhat).max(initial=0)) + (
        float(np.abs(f64(add)).max()) if add is not None else 0
    )
    return (
        dx.reshape(x.shape),
        (dy * xhat).sum(axis=0),
        dy.sum(axis=0),
        np.abs(dy * xhat).sum(axis=0),
        np.abs(dy).sum(axis=0),
        terms,
    )


def assert_reduction(got, ref, abs_sum, what):
    """A column sum over rows in fp32: within fp32 summation error of the float64 sum."""
    tol = 1e-6 * (abs_sum + 1.0) * 8
    if got.dtype != np.float32:
        tol = tol + np.abs(ref) * (2.0**-8 if got.dtype == BF16 else 2.0**-11)
    err = np.abs(f64(got) - ref)
    assert (err <= tol).all(), f"{what}: max err {err.max()} (tol {tol[np.argmax(err - tol)]})"


@pytest.mark.parametrize("variant", ["layernorm", "rmsnorm", "rmsnorm_add"])
@pytest.mark.parametrize("zcg", [False, True], ids=["gamma", "zero_centered"])
@pytest.mark.parametrize("dtype", HP_TYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_bwd(shape, dtype, zcg, variant):
    rms = variant != "layernorm"
    x, gamma, beta = inputs(shape, dtype, "bwd")
    rng = rng_for("norm-bwd", shape, dtype_id(dtype))
    dz = rng.standard_normal(shape).astype(dtype)
    add = rng.standard_normal(shape).astype(dtype) if variant == "rmsnorm_add" else None
    y = np.zeros(shape, np.float32)
    mu, rsigma = run_fwd(x, gamma, beta, hp_output(y), rms, zcg)
    h = shape[-1]
    dx = np.zeros(shape, dtype)
    dgamma, dbeta = np.zeros(h, dtype), np.zeros(h, dtype)
    cfg = _C.NormConfig(zero_centered_gamma=zcg)
    if variant == "layernorm":
        _C.layernorm_bwd(
            tensor(dz),
            tensor(x),
            tensor(mu),
            tensor(rsigma),
            tensor(gamma),
            tensor(dx),
            tensor(dgamma),
            tensor(dbeta),
            cfg,
        )
    elif variant == "rmsnorm":
        _C.rmsnorm_bwd(tensor(dz), tensor(x), tensor(rsigma), tensor(gamma), tensor(dx), tensor(dgamma), cfg)
    else:
        _C.rmsnorm_bwd_add(
            tensor(dz), tensor(x), tensor(add), tensor(rsigma), tensor(gamma), tensor(dx), tensor(dgamma), cfg
        )
    rdx, rdg, rdb, dg_abs, db_abs, terms = ref_bwd(dz, x, mu, rsigma, gamma, rms, zcg, add)
    # dx cancels (dxhat minus its projections; all of it for H = 1), so its fp32 error is a few
    # ulps of the terms, not of dx.
    assert_matches_ref(dx, rdx, "dx", rtol=1e-6, atol=4e-7 * terms)
    assert_reduction(dgamma, rdg, dg_abs, "dgamma")
    if variant == "layernorm":
        assert_reduction(dbeta, rdb, db_abs, "dbeta")


def test_bwd_dbeta_optional_and_deterministic():
    x, gamma, beta = inputs((129, 257), np.float32, "det")
    dz = rng_for("det").standard_normal(x.shape).astype(np.float32)
    y = np.zeros_like(x)
    mu, rs = run_fwd(x, gamma, beta, hp_output(y), rms=False)
    outs = []
    for _ in range(2):
        dx, dg = np.zeros_like(x), np.zeros(257, np.float32)
        _C.layernorm_bwd(tensor(dz), tensor(x), tensor(mu), tensor(rs), tensor(gamma), tensor(dx), tensor(dg))
        outs.append((dx, dg))
    assert_bits_equal(outs[0][0], outs[1][0], "dx run to run")
    assert_bits_equal(outs[0][1], outs[1][1], "dgamma run to run")


# ---- errors ---------------------------------------------------------------------------------


def raises(exc, text):
    return pytest.raises(exc, match=re.escape(text))


class Setup:
    def __init__(self, shape=(7, 13)):
        self.x, self.gamma, self.beta = inputs(shape, np.float32, "err")
        self.y = np.zeros(shape, np.float32)
        rows = O.matrix_dims(shape)[0]
        self.mu, self.rs = f32(0, (rows,)), f32(1, (rows,))
        self.dx = np.zeros(shape, np.float32)
        self.dg, self.db = np.zeros(shape[-1], np.float32), np.zeros(shape[-1], np.float32)

    def fwd(self, **kw):
        a = dict(
            input=tensor(self.x),
            gamma=tensor(self.gamma),
            beta=tensor(self.beta),
            output=hp_output(self.y),
            mu=tensor(self.mu),
            rsigma=tensor(self.rs),
        )
        a.update(kw)
        _C.layernorm_fwd(**a)

    def bwd(self, **kw):
        a = dict(
            dz=tensor(self.x),
            x=tensor(self.x),
            mu=tensor(self.mu),
            rsigma=tensor(self.rs),
            gamma=tensor(self.gamma),
            dx=tensor(self.dx),
            dgamma=tensor(self.dg),
            dbeta=tensor(self.db),
        )
        a.update(kw)
        _C.layernorm_bwd(**a)


F32, I32 = int(_C.DType.FLOAT32), int(_C.DType.INT32)


def test_fwd_errors():
    s = Setup()
    p = "te_layernorm_fwd: "
    with raises(ValueError, p + "input.dtype: expected float32, float16, bfloat16, got int32"):
        s.fwd(input=tensor(s.x, I32))
    with raises(ValueError, p + "input.shape: expected a last dim (H, the normalized size) >= 1, got [7, 0]"):
        s.fwd(input=_C.Tensor(0, F32, [7, 0]))
    with raises(ValueError, p + "input.ndim: expected >= 1"):
        s.fwd(input=tensor(s.x, shape=[]))
    with raises(ValueError, p + "gamma.shape: expected [13] ([H], the input's last dim), got [12]"):
        s.fwd(gamma=tensor(s.gamma[:12].copy()))
    with raises(ValueError, p + "beta.dtype: expected float32, float16, bfloat16, got float8_e4m3"):
        s.fwd(beta=tensor(s.beta, int(_C.DType.FLOAT8_E4M3)))
    with raises(
        ValueError, p + "mu.shape: expected 7 elements (one per row of the [M, H] input, M = 7), got [6]"
    ):
        s.fwd(mu=tensor(s.mu[:6].copy()))
    with raises(ValueError, p + "rsigma.dtype: expected float32, got bfloat16"):
        s.fwd(rsigma=tensor(s.rs.view(np.uint16)[:7].copy(), int(_C.DType.BFLOAT16)))
    with raises(
        ValueError,
        p
        + "output->rowwise_data.shape: expected [7, 13] (or any with the same last dim and element count), got [7, 12]",
    ):
        s.fwd(output=hp_output(np.zeros((7, 12), np.float32)))
    with raises(
        ValueError,
        p
        + "output->rowwise_data.dtype: expected float32, float16, bfloat16, float8_e4m3, float8_e5m2, got int32",
    ):
        s.fwd(output=_C.QuantizedTensor(0, rowwise_data=tensor(s.y, I32)))
    with raises(
        ValueError,
        p + "output->columnwise_data: expected NULL for a high-precision (float32) output, got a buffer",
    ):
        s.fwd(output=_C.QuantizedTensor(0, rowwise_data=tensor(s.y), columnwise_data=tensor(s.y)))
    with raises(ValueError, p + "output->amax: expected NULL for a high-precision (float32) output"):
        s.fwd(output=_C.QuantizedTensor(0, rowwise_data=tensor(s.y), amax=tensor(f32())))
    with raises(
        ValueError,
        p + "output->scaling_mode: expected per_tensor for a high-precision (float32) output, got block_1d",
    ):
        s.fwd(output=_C.QuantizedTensor(1, rowwise_data=tensor(s.y)))
    q = Quantized(0, (7, 13), O.E4M3, columnwise=False)
    with raises(
        ValueError,
        p + "output->scale: delayed scaling (quant_config->compute_scale = 0) needs the fp32 [1] scale",
    ):
        s.fwd(output=q.descriptor())
    q = Quantized(0, (7, 13), O.E4M3, columnwise=False, scale=1.0)
    with raises(ValueError, p + "quant_config->amax_epsilon: expected a value >= 0, got -1"):
        s.fwd(output=q.descriptor(), quant_config=_C.QuantConfig(amax_epsilon=-1.0))
    q = Quantized(1, (7, 13), O.E4M3)
    d = q.descriptor()
    d.columnwise_data = tensor(np.zeros((12, 7), np.uint8), int(_C.DType.FLOAT8_E4M3))
    with raises(ValueError, p + "output->columnwise_data.shape: expected [13, 7]"):
        s.fwd(output=d)
    with raises(ValueError, p + "config->eps: expected a finite value >= 0, got -1"):
        s.fwd(config=_C.NormConfig(eps=-1.0))
    with raises(ValueError, p + "config->eps: expected a finite value >= 0, got nan"):
        s.fwd(config=_C.NormConfig(eps=float("nan")))
    c = _C.NormConfig()
    c.zero_centered_gamma = 2
    with raises(ValueError, p + "config->zero_centered_gamma: expected 0 or 1, got 2"):
        s.fwd(config=c)
    c = _C.NormConfig()
    c.struct_size = 4
    with raises(ValueError, p + "config->struct_size: expected at least 12"):
        s.fwd(config=c)
    if _C.cuda_device_count() == 0:  # host memory posing as CUDA: only where no GPU would run it
        with raises(NotImplementedError, p + "input is on cuda:0 but"):
            s.fwd(
                input=_C.Tensor(s.x.ctypes.data, F32, [7, 13], 1, 0),
                gamma=_C.Tensor(s.gamma.ctypes.data, F32, [13], 1, 0),
                beta=None,
                mu=None,
                rsigma=None,
                output=_C.QuantizedTensor(0, rowwise_data=_C.Tensor(s.y.ctypes.data, F32, [7, 13], 1, 0)),
            )
    with raises(ValueError, p + "gamma.device: expected the device of input (cpu), got cuda:0"):
        s.fwd(gamma=_C.Tensor(s.gamma.ctypes.data, F32, [13], 1, 0))
    with raises(ValueError, "te_rmsnorm_fwd: rsigma.shape: expected 7 elements"):
        _C.rmsnorm_fwd(tensor(s.x), tensor(s.gamma), hp_output(s.y), tensor(s.rs[:3].copy()))


def test_bwd_errors():
    s = Setup()
    p = "te_layernorm_bwd: "
    with raises(ValueError, p + "x.dtype: expected float32, float16, bfloat16, got int32"):
        s.bwd(x=tensor(s.x, I32))
    with raises(
        ValueError,
        p
        + "dz.shape: expected [7, 13] (x's shape, or any with the same last dim and element count), got [13, 7]",
    ):
        s.bwd(dz=tensor(s.x, shape=[13, 7]))
    with raises(ValueError, p + "mu.data: expected a pointer to 1 elements, got NULL"):
        s.bwd(mu=_C.Tensor(0, F32, []))
    with raises(ValueError, p + "rsigma.shape: expected 7 elements"):
        s.bwd(rsigma=tensor(s.rs[:2].copy()))
    with raises(ValueError, p + "gamma.shape: expected [13]"):
        s.bwd(gamma=tensor(s.gamma, shape=[13, 1]))
    with raises(ValueError, p + "dx.dtype: expected float32, float16, bfloat16, got float8_e5m2"):
        s.bwd(dx=tensor(s.dx, int(_C.DType.FLOAT8_E5M2)))
    with raises(ValueError, p + "dx.shape: expected [7, 13]"):
        s.bwd(dx=tensor(s.dx, shape=[91]))
    with raises(ValueError, p + "dgamma.shape: expected [13] ([H], the input's last dim), got [7]"):
        s.bwd(dgamma=tensor(s.dg[:7].copy()))
    with raises(ValueError, p + "dbeta.dtype: expected float32, float16, bfloat16, got int32"):
        s.bwd(dbeta=tensor(s.db, I32))
    c = _C.NormConfig()
    c.struct_size = 0
    with raises(ValueError, p + "config->struct_size: expected at least 12"):
        s.bwd(config=c)
    with raises(ValueError, "te_rmsnorm_bwd_add: add.shape: expected [7, 13] (x's shape"):
        _C.rmsnorm_bwd_add(
            tensor(s.x),
            tensor(s.x),
            tensor(s.x[:3].copy()),
            tensor(s.rs),
            tensor(s.gamma),
            tensor(s.dx),
            tensor(s.dg),
        )
    with raises(ValueError, "te_rmsnorm_bwd: dgamma.dtype: expected float32, float16, bfloat16, got int32"):
        _C.rmsnorm_bwd(
            tensor(s.x), tensor(s.x), tensor(s.rs), tensor(s.gamma), tensor(s.dx), tensor(s.dg, I32)
        )


def test_failed_call_writes_nothing():
    """Validation finishes before any kernel runs: outputs and stats keep their sentinel bits."""
    s = Setup()
    y, mu, rs = f32(np.nan, (7, 13)), f32(np.nan, (7,)), f32(np.nan, (7,))
    with raises(ValueError, "te_layernorm_fwd: beta.shape"):
        s.fwd(output=hp_output(y), mu=tensor(mu), rsigma=tensor(rs), beta=tensor(s.beta[:5].copy()))
    assert np.isnan(y).all() and np.isnan(mu).all() and np.isnan(rs).all()
    dx, dg = f32(np.nan, (7, 13)), f32(np.nan, (13,))
    with raises(ValueError, "te_layernorm_bwd: dbeta.shape"):
        s.bwd(dx=tensor(dx), dgamma=tensor(dg), dbeta=tensor(s.db[:3].copy()))
    assert np.isnan(dx).all() and np.isnan(dg).all()
