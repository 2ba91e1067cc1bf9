"""te_gemm with MXFP8 and NVFP4 operands on the CPU backend against a float64 numpy product of the
operands as te/gemm.h says every backend reads them: the copy with K contiguous, dequantized by the
oracle (MXFP8 float(q) * 2^(e-127); NVFP4 (q * s_block) * s_global) and rounded to BF16. Tolerances
are NUMERICS.md's: normwise relative error <= 1e-5 in fp32 (1e-2 with a bf16 output) against that
product, and loose against the unquantized one. The errors: mixed families, the Hadamard transform on
one side only, missing parts."""

from __future__ import annotations

import re

import _oracle as O
import ml_dtypes
import numpy as np
import pytest
from _buffers import rng_for, tensor
from _mx import MxQuantized
from te_core import _C

BF16 = ml_dtypes.bfloat16
LAYOUTS = [(False, False), (False, True), (True, False), (True, True)]
LAYOUT_IDS = ["NN_dgrad", "NT_fprop", "TN_wgrad", "TT"]
SHAPES = {
    "mxfp8": [(7, 13, 5), (1, 1, 1), (64, 48, 96), (129, 70, 130), (0, 5, 3), (4, 0, 3), (4, 5, 0)],
    # NVFP4 copies need even stored rows: every source dim even.
    "nvfp4": [(6, 14, 4), (2, 2, 2), (64, 48, 96), (130, 70, 34), (0, 4, 2), (4, 0, 2), (4, 6, 0)],
}
LOOSE = {"mxfp8": 0.1, "nvfp4": 0.2}


def hp(arr: np.ndarray) -> _C.QuantizedTensor:
    return _C.QuantizedTensor(int(_C.ScalingMode.PER_TENSOR), rowwise_data=tensor(arr))


def random_matrix(rng, shape, spread=3.0) -> np.ndarray:
    x = rng.standard_normal(shape)
    if x.size:
        x = x * np.exp2(rng.uniform(-spread, spread, (shape[0], 1)))
    return np.ascontiguousarray(x.astype(np.float32))


def quantize(family, x, fmt="e4m3", rht=False) -> MxQuantized:
    return MxQuantized(family, x.shape, fmt, rht=rht).quantize(x)


def stored_copy(q: MxQuantized, columnwise: bool) -> np.ndarray:
    """The float64 values the GEMM multiplies from one stored copy ([R, C] as stored): dequantized
    by the oracle in fp32, then rounded to BF16."""
    if columnwise:
        shape, data, scale, i = (q.cols, q.rows), q.columnwise, q.columnwise_scale_inv, 1
    else:
        shape, data, scale, i = (q.rows, q.cols), q.rowwise, q.rowwise_scale_inv, 0
    if q.family == "mxfp8":
        v = O.dequantize_mxfp8(data.reshape(shape), q.fmt, scale)
    else:
        v = O.dequantize_nvfp4(O.unpack_e2m1(data, shape), scale, q.amax[i])
    return v.astype(BF16).astype(np.float64)


def operand_value(q: MxQuantized, trans: bool, is_b: bool) -> np.ndarray:
    """op(X) from the copy with K contiguous: A's column-wise copy iff trans_a, B's iff not
    trans_b (te/gemm.h)."""
    columnwise = trans if not is_b else not trans
    src = stored_copy(q, columnwise)
    src = src.T if columnwise else src
    return src.T if trans else src


def assert_close(got, want, tol, what=""):
    got = np.asarray(got).astype(np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert np.isfinite(got).all(), f"{what}: non-finite output"
    err, ref = np.linalg.norm(got - want), np.linalg.norm(want)
    assert err <= tol * max(ref, 1e-30), (
        f"{what}: normwise relative error {err / max(ref, 1e-30):.3g} > {tol}"
    )


def sources(rng, m, n, k, trans_a, trans_b):
    a = random_matrix(rng, (k, m) if trans_a else (m, k))
    b = random_matrix(rng, (n, k) if trans_b else (k, n))
    return a, b


@pytest.mark.parametrize("out_dtype", [np.float32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("trans_a,trans_b", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("family", ["mxfp8", "nvfp4"])
@pytest.mark.parametrize("index", range(7))
def test_gemm_mx_matches_oracle(index, family, trans_a, trans_b, out_dtype):
    m, n, k = SHAPES[family][index]
    rng = rng_for("gemm-mx", family, index, trans_a, trans_b)
    a, b = sources(rng, m, n, k, trans_a, trans_b)
    qa, qb = quantize(family, a), quantize(family, b)
    d = np.full((m, n), np.nan, out_dtype)
    _C.gemm(qa.descriptor(), qb.descriptor(), hp(d), _C.GemmConfig(trans_a=trans_a, trans_b=trans_b))
    want = operand_value(qa, trans_a, False) @ operand_value(qb, trans_b, True)
    assert_close(d, want, 1e-5 if out_dtype == np.float32 else 1e-2, "against the dequantized operands")
    if m and n and k:
        exact = (a.T if trans_a else a).astype(np.float64) @ (b.T if trans_b else b).astype(np.float64)
        assert_close(d, exact, LOOSE[family], "against the unquantized product")


@pytest.mark.parametrize("fmts", [("e4m3", "e5m2"), ("e5m2", "e4m3")])
def test_gemm_mxfp8_mixed_fp8_formats(fmts):
    rng = rng_for("gemm-mx-fmts", fmts)
    a, b = random_matrix(rng, (48, 64)), random_matrix(rng, (40, 64))
    qa, qb = quantize("mxfp8", a, fmts[0]), quantize("mxfp8", b, fmts[1])
    d = np.zeros((48, 40), np.float32)
    _C.gemm(qa.descriptor(), qb.descriptor(), hp(d), _C.GemmConfig(trans_b=True))
    assert_close(d, operand_value(qa, False, False) @ operand_value(qb, True, True), 1e-5)


@pytest.mark.parametrize("family", ["mxfp8", "nvfp4"])
def test_gemm_mx_epilogues(family):
    """Bias with alpha and beta, and the bias gradient (row sums of the dequantized op(A))."""
    rng = rng_for("gemm-mx-epi", family)
    a, b = random_matrix(rng, (32, 64)), random_matrix(rng, (48, 64))
    qa, qb = quantize(family, a), quantize(family, b)
    av, bv = operand_value(qa, False, False), operand_value(qb, True, True)
    bias = rng.standard_normal(48).astype(np.float32)
    d0 = rng.standard_normal((32, 48)).astype(np.float32)
    d = d0.copy()
    cfg = _C.GemmConfig(trans_b=True, alpha=0.5, beta=1.0, epilogue=int(_C.Epilogue.BIAS), bias=tensor(bias))
    _C.gemm(qa.descriptor(), qb.descriptor(), hp(d), cfg)
    assert_close(d, 0.5 * (av @ bv) + d0 + bias, 1e-5, "bias")
    bgrad = np.zeros(32, np.float32)
    d = np.zeros((32, 48), np.float32)
    cfg = _C.GemmConfig(trans_b=True, epilogue=int(_C.Epilogue.BGRAD), bias_grad=tensor(bgrad))
    _C.gemm(qa.descriptor(), qb.descriptor(), hp(d), cfg)
    assert_close(bgrad, av.sum(axis=1), 1e-5, "bias_grad")


def test_gemm_nvfp4_wgrad_with_hadamard():
    """wgrad dw = dy^T x reads both column-wise copies; with the transform on both, the product of
    the stored (transformed) copies is the product of the sources: the transforms cancel."""
    rng = rng_for("gemm-rht")
    x, dy = random_matrix(rng, (64, 48), 1.0), random_matrix(rng, (64, 32), 1.0)
    qx, qdy = quantize("nvfp4", x, rht=True), quantize("nvfp4", dy, rht=True)
    dw = np.zeros((32, 48), np.float32)
    _C.gemm(qdy.descriptor(), qx.descriptor(), hp(dw), _C.GemmConfig(trans_a=True))
    want = operand_value(qdy, True, False) @ operand_value(qx, False, True)
    assert_close(dw, want, 1e-5, "against the stored copies")
    assert_close(dw, dy.T.astype(np.float64) @ x, LOOSE["nvfp4"], "against the unquantized product")


def raises(match, a, b, d=None, **config):
    d = hp(np.zeros((8, 8), np.float32)) if d is None else d
    with pytest.raises(ValueError, match="^te_gemm: " + re.escape(match)):
        _C.gemm(a, b, d, _C.GemmConfig(**config))


def test_gemm_mx_errors():
    x = np.ones((8, 32), np.float32)
    mx, nv = quantize("mxfp8", x), quantize("nvfp4", x)
    pt = _C.QuantizedTensor(
        int(_C.ScalingMode.PER_TENSOR),
        rowwise_data=tensor(np.zeros((8, 32), np.uint8), int(_C.DType.FLOAT8_E4M3)),
        rowwise_scale_inv=tensor(np.ones(1, np.float32)),
    )
    mixing = "(te_gemm does not mix MXFP8 or NVFP4 operands with other scaling modes: both operands are mxfp8_1d, or both nvfp4_1d)"
    raises(
        f"b->scaling_mode: expected mxfp8_1d like a's {mixing}, got per_tensor",
        mx.descriptor(),
        pt,
        trans_b=True,
    )
    raises(
        f"b->scaling_mode: expected per_tensor like a's {mixing}, got mxfp8_1d",
        pt,
        mx.descriptor(),
        trans_b=True,
    )
    raises(
        f"b->scaling_mode: expected nvfp4_1d like a's {mixing}, got mxfp8_1d",
        nv.descriptor(),
        mx.descriptor(),
        trans_b=True,
    )
    e5 = quantize("mxfp8", x, "e5m2")
    raises(
        "b->rowwise_data.dtype: expected float8_e4m3 when a is float8_e5m2 (E5M2 x E5M2 is not a supported MXFP8 GEMM)",
        e5.descriptor(),
        e5.descriptor(),
        trans_b=True,
    )
    d = nv.descriptor()
    d.amax = _C.Tensor(0, 0, [])
    raises(
        "a->amax: nvfp4_1d needs the fp32 [2] global amaxes (row-wise, column-wise), got NULL",
        d,
        nv.descriptor(),
        trans_b=True,
    )
    d = mx.descriptor()
    d.columnwise_data = _C.Tensor(0, 0, [])
    raises(
        "b->columnwise_data: trans_b = 0 needs the column-wise copy (quantize with columnwise usage), got NULL",
        _C.QuantizedTensor(
            int(_C.ScalingMode.MXFP8_1D),
            rowwise_data=tensor(np.zeros((8, 8), np.uint8), int(_C.DType.FLOAT8_E4M3)),
            rowwise_scale_inv=tensor(np.zeros((128, 4), np.uint8), int(_C.DType.FLOAT8_E8M0)),
        ),
        d,
        d=hp(np.zeros((8, 32), np.float32)),
    )
    d = mx.descriptor()
    d.rowwise_scale_inv = tensor(np.zeros((128, 4), np.float32))
    raises("a->rowwise_scale_inv.dtype: expected float8_e8m0, got float32", d, mx.descriptor(), trans_b=True)
    fp8_out = _C.QuantizedTensor(
        int(_C.ScalingMode.PER_TENSOR),
        rowwise_data=tensor(np.zeros((8, 8), np.uint8), int(_C.DType.FLOAT8_E4M3)),
        scale=tensor(np.ones(1, np.float32)),
    )
    raises(
        "d->rowwise_data.dtype: expected float32, float16 or bfloat16 with block-scaled operands (a is mxfp8_1d)",
        mx.descriptor(),
        mx.descriptor(),
        fp8_out,
        trans_b=True,
    )
    # the Hadamard transform on one operand of the contraction only
    y = np.ones((16, 32), np.float32)
    with_rht, without = quantize("nvfp4", y, rht=True), quantize("nvfp4", y)
    raises(
        "b: the other operand's column-wise copy carries the Hadamard transform (columnwise_rht) and this one's b->columnwise_data does not",
        with_rht.descriptor(),
        without.descriptor(),
        hp(np.zeros((32, 32), np.float32)),
        trans_a=True,
    )
    raises(
        "a: the other operand's column-wise copy carries the Hadamard transform (columnwise_rht) and this one's a->rowwise_data does not",
        nv.descriptor(),
        with_rht.descriptor(),
        hp(np.zeros((8, 32), np.float32)),
    )


LOG_SNIPPET = """
import logging, sys
import numpy as np
sys.path.insert(0, {here!r})
import te_core
from _mx import MxQuantized
from _buffers import tensor
from te_core import _C
said = []
handler = logging.Handler()
handler.emit = lambda r: said.append((r.levelno, r.getMessage()))
logging.getLogger("te").addHandler(handler)
logging.getLogger("te").setLevel(logging.INFO)
x = np.ones((32, 64), np.float32)
for family in ["mxfp8", "nvfp4", "mxfp8"]:
    q = MxQuantized(family, x.shape).quantize(x)
    d = np.zeros((32, 32), np.float32)
    _C.gemm(q.descriptor(), q.descriptor(), _C.QuantizedTensor(0, rowwise_data=tensor(d)), _C.GemmConfig(trans_b=True))
for level, message in said:
    print(level, message)
"""


def test_gemm_mx_cpu_logs_once_per_format():
    """In a fresh process (log_info_once is once per process): one INFO line per format saying the
    GEMM runs by block dequantization, however many GEMMs run."""
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(
        [sys.executable, "-c", LOG_SNIPPET.format(here=here)], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    lines = [line for line in out if "block dequantization" in line]
    assert len(lines) == 2, out
    assert lines[0].startswith("20 te_gemm: mxfp8_1d operands on the CPU") and "nvfp4_1d" in lines[1]
