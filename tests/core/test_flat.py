"""The flat entry points te_core._C.quantize_flat / gemm_flat / dequantize_flat and the fused ops'
norm_fwd_flat / norm_bwd_flat / activation_fwd_flat / activation_bwd_flat / dbias_quantize_flat
(plain ints and tuples, no descriptor objects; DESIGN.md "The hot path"): they compute what the
descriptor functions compute, and every bad argument comes back as te's ValueError naming it (the C layer is
the validator) or, for a value of the wrong Python type, a TypeError naming the argument."""

import re

import numpy as np
import pytest
from _buffers import DATA_SENTINEL, bits, f32, fp8_buffer, tensor
from te_core import _C

D = _C.DType
E4M3, F32, I32 = int(D.FLOAT8_E4M3), int(D.FLOAT32), int(D.INT32)


def ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def spec(a: np.ndarray, dtype: int = F32, shape=None, device: int = -1) -> tuple:
    return (ptr(a), dtype, tuple(a.shape if shape is None else shape), device)


class Quantize:
    """A valid delayed-scaling per-tensor quantize_flat call of a [4, 8] fp32 input; call() with
    keyword overrides of any argument."""

    def __init__(self):
        self.x = np.linspace(-2, 2, 32, dtype=np.float32).reshape(4, 8)
        self.rd, self.cd = fp8_buffer((4, 8)), fp8_buffer((8, 4))
        self.rs, self.cs, self.amax, self.scale = f32(), f32(), f32(), f32(2.0)

    def args(self):
        return dict(
            x_ptr=ptr(self.x), x_dtype=F32, shape=(4, 8), device=-1, scaling_mode=0,
            out_dtype=E4M3, rd_ptr=ptr(self.rd), rs_ptr=ptr(self.rs), rs_shape=(1,),
            cd_ptr=ptr(self.cd), cd_shape=(8, 4), cs_ptr=ptr(self.cs), cs_shape=(1,),
            amax=spec(self.amax), scale=spec(self.scale), config=None, stream=0,
        )  # fmt: skip

    def call(self, **over):
        a = self.args()
        a.update(over)
        return _C.quantize_flat(**a)


def c_error(exc, message, fn, **kw):
    with pytest.raises(exc, match=re.escape(message)) as info:
        fn(**kw)
    assert str(info.value) == _C.last_error()  # the C layer's own message, unchanged
    return info.value


def test_quantize_flat_matches_descriptor_quantize():
    q = Quantize()
    q.call()
    rd, cd, rs, amax = fp8_buffer((4, 8)), fp8_buffer((8, 4)), f32(), f32()
    out = _C.QuantizedTensor(
        0, rowwise_data=tensor(rd, E4M3), rowwise_scale_inv=tensor(rs),
        columnwise_data=tensor(cd, E4M3), columnwise_scale_inv=tensor(f32()),
        amax=tensor(amax), scale=tensor(f32(2.0)),
    )  # fmt: skip
    _C.quantize(tensor(q.x), out)
    assert (q.rd == rd).all() and (q.cd == cd).all() and (q.cd == rd.T).all()
    assert q.rs[0] == rs[0] == q.cs[0] == 0.5 and q.amax[0] == amax[0] == 2.0


def test_quantize_flat_one_copy_and_descriptor_stats():
    q = Quantize()
    q.call(cd_shape=None, cs_shape=None, amax=_C.Tensor(ptr(q.amax), F32, [1]))  # row-wise only
    assert (q.cd == DATA_SENTINEL).all() and (q.rd != DATA_SENTINEL).any() and q.amax[0] == 2.0
    q = Quantize()
    q.call(rs_shape=None)  # column-wise only
    assert (q.rd == DATA_SENTINEL).all() and (q.cd != DATA_SENTINEL).any()


def test_quantize_flat_config():
    q = Quantize()
    q.call(config=_C.QuantConfig(compute_scale=True))  # current scaling writes scale and amax
    assert q.amax[0] == 2.0 and q.scale[0] == 224.0 and q.rs[0] == 1 / 224.0


def test_quantize_flat_errors():
    q = Quantize()
    c_error(ValueError, "te_quantize: input.data: expected a pointer to 32 elements, got NULL",
            q.call, x_ptr=0)  # fmt: skip
    c_error(ValueError, "te_quantize: input.dtype: expected float32, float16, bfloat16, got int32",
            q.call, x_dtype=I32)  # fmt: skip
    c_error(ValueError, "te_quantize: output->rowwise_data.dtype: expected float8_e4m3, float8_e5m2",
            q.call, out_dtype=F32)  # fmt: skip
    c_error(ValueError, "te_quantize: output->rowwise_scale_inv.shape: expected 1 element, got [2]",
            q.call, rs_shape=(2,))  # fmt: skip
    c_error(ValueError, "te_quantize: output->columnwise_data.shape: expected [8, 4]",
            q.call, cd_shape=(4, 8))  # fmt: skip
    c_error(ValueError, "te_quantize: output->scale: delayed scaling", q.call, scale=None)
    c_error(ValueError, "te_quantize: output->amax.device: expected the device of input (cpu)",
            q.call, amax=spec(q.amax, device=0))  # fmt: skip
    c_error(ValueError, "te_quantize: output: expected rowwise_data and/or columnwise_data",
            q.call, rs_shape=None, cd_shape=None, cs_shape=None)  # fmt: skip
    c_error(
        ValueError,
        "te_quantize: input.shape: expected non-negative sizes, got [4, -8]",
        q.call,
        shape=(4, -8),
    )
    assert (q.rd == DATA_SENTINEL).all() and q.amax[0] == 0  # no failed call wrote anything


def test_quantize_flat_conversion_errors():
    q = Quantize()
    with pytest.raises(ValueError, match=r"^shape: expected at most 8 dims, got 9$"):
        q.call(shape=(1,) * 9)
    with pytest.raises(TypeError, match=r"^shape: expected a tuple of ints"):
        q.call(shape=(4, "8"))
    with pytest.raises(TypeError, match=r"^cd_shape: expected a tuple of ints"):
        q.call(cd_shape=[8, None])
    with pytest.raises(TypeError, match=r"^amax: expected None, a Tensor or a \(ptr"):
        q.call(amax=(ptr(q.amax), F32, (1,)))
    with pytest.raises(TypeError, match=r"^scale: expected None, a Tensor or a \(ptr"):
        q.call(scale=5)
    with pytest.raises(TypeError, match=r"^amax: expected None, a Tensor or a \(ptr"):
        q.call(amax=("p", F32, (1,), -1))
    assert (q.rd == DATA_SENTINEL).all()


class Gemm:
    """A valid fp32 D[2, 3] = A[2, 8] B[3, 8]^T gemm_flat call; call() with keyword overrides."""

    def __init__(self):
        self.a = np.arange(16, dtype=np.float32).reshape(2, 8) / 8
        self.b = np.ones((3, 8), np.float32)
        self.d = np.full((2, 3), 7.0, np.float32)

    def call(self, **over):
        args = dict(
            a_mode=0, a_rd=spec(self.a), a_rs=None, a_cd=None, a_cs=None,
            b_mode=0, b_rd=spec(self.b), b_rs=None, b_cd=None, b_cs=None,
            d=spec(self.d), config=_C.GemmConfig(trans_b=True), bias=None, aux=None,
            bias_grad=None, stream=0,
        )  # fmt: skip
        args.update(over)
        return _C.gemm_flat(**args)


def test_gemm_flat_matches_matmul_and_epilogues():
    g = Gemm()
    g.call()
    np.testing.assert_allclose(g.d, g.a @ g.b.T, rtol=1e-6)
    bias = np.array([1, 2, 3], np.float32)
    g.call(config=_C.GemmConfig(trans_b=True, epilogue=int(_C.Epilogue.BIAS)), bias=spec(bias))
    np.testing.assert_allclose(g.d, g.a @ g.b.T + bias, rtol=1e-6)
    # the config object's own bias is ignored: the argument replaces it
    cfg = _C.GemmConfig(trans_b=True, bias=tensor(bias))
    g.call(config=cfg)
    np.testing.assert_allclose(g.d, g.a @ g.b.T, rtol=1e-6)


def test_gemm_flat_errors():
    g = Gemm()
    c_error(ValueError, "te_gemm: b: expected K = 8", g.call, config=None)  # no trans_b
    c_error(ValueError, "te_gemm: d->rowwise_data.dtype: expected float32", g.call,
            d=spec(g.d, I32))  # fmt: skip
    c_error(ValueError, "te_gemm: d->rowwise_data: expected the [2, 3] output, got NULL", g.call,
            d=None)  # fmt: skip
    c_error(ValueError, "te_gemm: b: expected rowwise_data and/or columnwise_data, got neither",
            g.call, b_rd=None)  # fmt: skip
    c_error(ValueError, "te_gemm: config->bias: expected NULL with epilogue DEFAULT", g.call,
            bias=spec(f32(0.0, (3,))))  # fmt: skip
    c_error(ValueError, "te_gemm: d->rowwise_data.device", g.call, d=spec(g.d, device=0))
    with pytest.raises(TypeError, match=r"^a_rd: expected None, a Tensor or a \(ptr"):
        g.call(a_rd=[ptr(g.a), F32, (2, 8), -1])
    assert (g.d == 7.0).all()  # nothing written


def test_gemm_flat_fp8_output_matches_descriptor_call():
    """d_scale / d_amax / d_scale_inv make D a per-tensor FP8 output: the same bits (data, amax,
    scale_inv) as te_gemm with a descriptor D carrying them; without d_scale it is te's error."""
    g = Gemm()
    bias = np.array([0.5, -1.0, 2.0], np.float32)
    cfg = _C.GemmConfig(trans_b=True, epilogue=int(_C.Epilogue.BIAS))
    flat = dict(d=fp8_buffer((2, 3)), amax=f32(), scale_inv=f32(), scale=f32(8.0))
    g.call(d=spec(flat["d"], E4M3), config=cfg, bias=spec(bias), d_scale=spec(flat["scale"]),
           d_amax=spec(flat["amax"]), d_scale_inv=spec(flat["scale_inv"]))  # fmt: skip
    desc = {k: v.copy() for k, v in flat.items()}
    desc["d"][:] = DATA_SENTINEL
    d = _C.QuantizedTensor(
        0, rowwise_data=tensor(desc["d"], E4M3), rowwise_scale_inv=tensor(desc["scale_inv"]),
        amax=tensor(desc["amax"]), scale=tensor(desc["scale"]),
    )  # fmt: skip
    _C.gemm(
        _C.QuantizedTensor(0, rowwise_data=tensor(g.a)), _C.QuantizedTensor(0, rowwise_data=tensor(g.b)),
        d, _C.GemmConfig(trans_b=True, epilogue=int(_C.Epilogue.BIAS), bias=tensor(bias)),
    )  # fmt: skip
    for k in flat:
        assert (bits(flat[k]) == bits(desc[k])).all(), k
    y = g.a @ g.b.T + bias
    assert flat["amax"][0] == np.abs(y).max() and flat["scale_inv"][0] == 1 / 8.0
    c_error(ValueError, "te_gemm: d->scale: an FP8 output (float8_e4m3) needs the fp32 [1] scale",
            g.call, d=spec(flat["d"], E4M3))  # fmt: skip


def test_dequantize_flat():
    data, si, out = np.full((4, 8), 0x38, np.uint8), f32(0.5), np.zeros((4, 8), np.float32)
    _C.dequantize_flat(0, spec(data, E4M3), spec(si), None, None, spec(out))
    assert (out == 0.5).all()
    c_error(ValueError, "te_dequantize: input: expected rowwise_data or columnwise_data",
            _C.dequantize_flat, scaling_mode=0, rowwise_data=None, rowwise_scale_inv=None,
            columnwise_data=None, columnwise_scale_inv=None, output=spec(out))  # fmt: skip
    c_error(ValueError, "te_dequantize: output.shape: expected [4, 8]", _C.dequantize_flat,
            scaling_mode=0, rowwise_data=spec(data, E4M3), rowwise_scale_inv=spec(si),
            columnwise_data=None, columnwise_scale_inv=None,
            output=spec(np.zeros((8, 4), np.float32)))  # fmt: skip
    c_error(ValueError, "te_dequantize: output.dtype: expected float32, float16, bfloat16, got int32",
            _C.dequantize_flat, scaling_mode=0, rowwise_data=spec(data, E4M3),
            rowwise_scale_inv=spec(si), columnwise_data=None, columnwise_scale_inv=None,
            output=spec(out, I32))  # fmt: skip


# ---- the fused ops' flat entry points -----------------------------------------------------------


def norm_inputs():
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((6, 40)) * 2 + 0.5).astype(np.float32)
    return (
        x,
        (rng.standard_normal(40) * 0.3 + 1).astype(np.float32),
        rng.standard_normal(40).astype(np.float32),
    )


@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
def test_norm_flat_matches_descriptor_calls(rms):
    """Forward with an FP8 (current scaling, both copies) output and the backward: the same bits
    as te_layernorm_* / te_rmsnorm_* through descriptors."""
    x, gamma, beta = norm_inputs()
    beta = None if rms else beta
    cfg, qcfg = _C.NormConfig(eps=1e-3, zero_centered_gamma=True), _C.QuantConfig(compute_scale=True)
    flat = dict(
        rd=fp8_buffer((6, 40)),
        cd=fp8_buffer((40, 6)),
        rs=f32(),
        cs=f32(),
        amax=f32(),
        scale=f32(),
        mu=f32(0, (6,)),
        rsigma=f32(0, (6,)),
    )
    desc = {k: v.copy() for k, v in flat.items()}
    _C.norm_fwd_flat(
        rms, spec(x), spec(gamma), None if beta is None else spec(beta), 0,
        spec(flat["rd"], E4M3), spec(flat["rs"]), spec(flat["cd"], E4M3), spec(flat["cs"]),
        spec(flat["amax"]), spec(flat["scale"]), None if rms else spec(flat["mu"]), spec(flat["rsigma"]), cfg, qcfg,
    )  # fmt: skip
    out = _C.QuantizedTensor(
        0, rowwise_data=tensor(desc["rd"], E4M3), rowwise_scale_inv=tensor(desc["rs"]),
        columnwise_data=tensor(desc["cd"], E4M3), columnwise_scale_inv=tensor(desc["cs"]),
        amax=tensor(desc["amax"]), scale=tensor(desc["scale"]),
    )  # fmt: skip
    if rms:
        _C.rmsnorm_fwd(tensor(x), tensor(gamma), out, tensor(desc["rsigma"]), cfg, qcfg)
    else:
        _C.layernorm_fwd(
            tensor(x), tensor(gamma), tensor(beta), out, tensor(desc["mu"]), tensor(desc["rsigma"]), cfg, qcfg
        )
    for k in flat:
        assert (bits(flat[k]) == bits(desc[k])).all(), k
    assert (flat["rd"] != DATA_SENTINEL).any() and (flat["cd"] != DATA_SENTINEL).any() and flat["amax"][0] > 0
    dz = np.linspace(-1, 1, 240, dtype=np.float32).reshape(6, 40)
    got = [f32(0, (6, 40)), f32(0, (40,)), f32(0, (40,))]
    want = [a.copy() for a in got]
    _C.norm_bwd_flat(
        rms, spec(dz), spec(x), None if rms else spec(flat["mu"]), spec(flat["rsigma"]), spec(gamma),
        spec(got[0]), spec(got[1]), None if rms else spec(got[2]), None, cfg,
    )  # fmt: skip
    if rms:
        _C.rmsnorm_bwd(
            tensor(dz),
            tensor(x),
            tensor(desc["rsigma"]),
            tensor(gamma),
            tensor(want[0]),
            tensor(want[1]),
            cfg,
        )
    else:
        _C.layernorm_bwd(
            tensor(dz),
            tensor(x),
            tensor(desc["mu"]),
            tensor(desc["rsigma"]),
            tensor(gamma),
            tensor(want[0]),
            tensor(want[1]),
            tensor(want[2]),
            cfg,
        )
    for g, w in zip(got, want, strict=True):
        assert (bits(g) == bits(w)).all()
    if rms:  # with add: te_rmsnorm_bwd_add, dx = the plain dx + add
        add = np.full((6, 40), 0.25, np.float32)
        _C.norm_bwd_flat(
            True,
            spec(dz),
            spec(x),
            None,
            spec(flat["rsigma"]),
            spec(gamma),
            spec(got[0]),
            spec(got[1]),
            None,
            spec(add),
            cfg,
        )
        np.testing.assert_allclose(got[0], want[0] + 0.25, rtol=1e-6, atol=1e-6)


def test_activation_and_dbias_flat_match_descriptor_calls():
    rng = np.random.default_rng(8)
    x = (rng.standard_normal((5, 64)) * 3).astype(np.float32)
    grad = rng.standard_normal((5, 32)).astype(np.float32)
    swiglu = int(_C.Activation.SWIGLU)
    y, y_desc = f32(0, (5, 32)), f32(0, (5, 32))
    _C.activation_fwd_flat(spec(x), swiglu, 0, spec(y), None, None, None, None, None)
    _C.activation_fwd(tensor(x), _C.QuantizedTensor(0, rowwise_data=tensor(y_desc)), swiglu)
    assert (bits(y) == bits(y_desc)).all() and (y != 0).any()
    cfg = _C.QuantConfig(compute_scale=True)
    got = dict(cd=fp8_buffer((64, 5)), cs=f32(), amax=f32(), scale=f32(), dbias=f32(0, (64,)))
    want = {k: v.copy() for k, v in got.items()}
    _C.activation_bwd_flat(
        spec(grad), spec(x), swiglu, 0, None, None, spec(got["cd"], E4M3), spec(got["cs"]),
        spec(got["amax"]), spec(got["scale"]), spec(got["dbias"]), cfg,
    )  # fmt: skip
    dx = _C.QuantizedTensor(
        0, columnwise_data=tensor(want["cd"], E4M3), columnwise_scale_inv=tensor(want["cs"]),
        amax=tensor(want["amax"]), scale=tensor(want["scale"]),
    )  # fmt: skip
    _C.activation_bwd(tensor(grad), tensor(x), dx, tensor(want["dbias"]), swiglu, cfg)
    for k in got:
        assert (bits(got[k]) == bits(want[k])).all(), k
    got = dict(rd=fp8_buffer((5, 64)), rs=f32(), amax=f32(), scale=f32(), dbias=f32(0, (64,)))
    want = {k: v.copy() for k, v in got.items()}
    _C.dbias_quantize_flat(
        spec(x), 0, spec(got["rd"], E4M3), spec(got["rs"]), None, None, spec(got["amax"]),
        spec(got["scale"]), spec(got["dbias"]), cfg,
    )  # fmt: skip
    out = _C.QuantizedTensor(
        0, rowwise_data=tensor(want["rd"], E4M3), rowwise_scale_inv=tensor(want["rs"]),
        amax=tensor(want["amax"]), scale=tensor(want["scale"]),
    )  # fmt: skip
    _C.dbias_quantize(tensor(x), out, tensor(want["dbias"]), cfg)
    for k in got:
        assert (bits(got[k]) == bits(want[k])).all(), k
    np.testing.assert_allclose(got["dbias"], x.sum(0), rtol=1e-5, atol=1e-5)


def test_fused_flat_errors():
    x, gamma, beta = norm_inputs()
    y, rsigma, mu = f32(0, (6, 40)), f32(0, (6,)), f32(0, (6,))
    with pytest.raises(ValueError, match=r"^beta: expected None for RMSNorm \(it has no bias\)$"):
        _C.norm_fwd_flat(
            True,
            spec(x),
            spec(gamma),
            spec(beta),
            0,
            spec(y),
            None,
            None,
            None,
            None,
            None,
            None,
            spec(rsigma),
        )
    with pytest.raises(ValueError, match=r"^add: expected None for LayerNorm"):
        _C.norm_bwd_flat(
            False,
            spec(y),
            spec(x),
            spec(mu),
            spec(rsigma),
            spec(gamma),
            spec(y),
            spec(f32(0, (40,))),
            None,
            spec(y),
        )
    c_error(ValueError, "te_layernorm_fwd: gamma.shape: expected [40]", _C.norm_fwd_flat, rms=False,
            x=spec(x), gamma=spec(gamma[:39]), beta=None, out_mode=0, rd=spec(y), rs=None, cd=None,
            cs=None, amax=None, scale=None, mu=spec(mu), rsigma=spec(rsigma))  # fmt: skip
    c_error(ValueError, "te_activation_fwd: output->rowwise_data.shape", _C.activation_fwd_flat,
            x=spec(x), activation=int(_C.Activation.GEGLU), out_mode=0, rd=spec(y), rs=None,
            cd=None, cs=None, amax=None, scale=None)  # fmt: skip
    c_error(ValueError, "te_dbias_quantize: dbias.shape: expected [40]", _C.dbias_quantize_flat,
            x=spec(x), mode=0, rd=spec(fp8_buffer((6, 40)), E4M3), rs=spec(f32()), cd=None,
            cs=None, amax=spec(f32()), scale=spec(f32()), dbias=spec(f32(0, (6,))),
            config=_C.QuantConfig(compute_scale=True))  # fmt: skip
    with pytest.raises(TypeError, match=r"^dbias: expected None, a Tensor or a \(ptr"):
        _C.activation_bwd_flat(spec(y), spec(x), 0, 0, spec(y), None, None, None, None, None, "dbias")
