"""te_torch.functional.gemm / gemm_dgrad / gemm_wgrad on the CPU backend.

Tolerances (NUMERICS.md "How to test numerics"), normwise relative error ||got - ref|| / ||ref||:
  high precision vs torch in fp32 on the same (rounded) inputs: 1e-5 fp32 out, 1e-2 bf16/fp16 out;
  FP8 vs the emulated reference (both operands dequantize()d, fp32 matmul): 1e-5 fp32 out, 1e-2
  bf16 out; FP8 vs the unquantized fp32 product: 0.1.
"""

import pytest
import te_torch as te
import torch
import torch.nn.functional as F
from te_torch import _kernels
from te_torch.functional import gemm, gemm_dgrad, gemm_wgrad

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
HP_TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}


def relerr(got, ref):
    got, ref = got.double(), ref.double()
    return ((got - ref).norm() / ref.norm()).item()


def randn(shape, seed, dtype=torch.float32, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype)


def per_tensor(t, fp8_dtype=E4M3):
    return te.Float8CurrentScalingQuantizer(fp8_dtype, "cpu")(t)


def block(t, dim, fp8_dtype=E4M3):
    return te.Float8BlockQuantizer(fp8_dtype, block_scaling_dim=dim)(t)


def dq(t):
    return t.dequantize(dtype=torch.float32)


def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def dgelu_tanh(x):
    x = x.detach().float().requires_grad_()
    (g,) = torch.autograd.grad(gelu_tanh(x).sum(), x)
    return g


# -- high precision -------------------------------------------------------------------------------

# (x shape, N): 2-D and 3-D x, sizes that are not multiples of 16
SHAPES = [((32, 64), 48), ((7, 33), 21), ((2, 5, 40), 17), ((3, 1, 24), 130)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("x_shape,n", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_fprop_high_precision_matches_linear(dtype, x_shape, n, with_bias):
    x = randn(x_shape, 1, dtype)
    w = randn((n, x_shape[-1]), 2, dtype)
    bias = randn((n,), 3, dtype) if with_bias else None
    y = gemm(x, w, bias=bias)
    ref = F.linear(x.float(), w.float(), None if bias is None else bias.float())
    assert y.dtype == dtype and y.shape == (*x_shape[:-1], n)
    assert relerr(y, ref) <= HP_TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("x_shape,n", SHAPES)
def test_dgrad_wgrad_high_precision(dtype, x_shape, n):
    k = x_shape[-1]
    x = randn(x_shape, 4, dtype)
    w = randn((n, k), 5, dtype)
    dy = randn((*x_shape[:-1], n), 6, dtype)
    dx = gemm_dgrad(dy, w)
    assert dx.dtype == dtype and dx.shape == x.shape
    assert relerr(dx, dy.float() @ w.float()) <= HP_TOL[dtype]
    dw, db = gemm_wgrad(dy, x, bias_grad=True)
    dy2, x2 = dy.float().reshape(-1, n), x.float().reshape(-1, k)
    assert dw.shape == (n, k) and db.shape == (n,) and dw.dtype == db.dtype == dtype
    assert relerr(dw, dy2.t() @ x2) <= HP_TOL[dtype]
    assert relerr(db, dy2.sum(0)) <= HP_TOL[dtype]


def test_non_contiguous_operands_are_made_contiguous():
    x = randn((40, 24), 7).t()  # [24, 40], not contiguous
    w = randn((40, 16), 8).t()
    assert relerr(gemm(x, w), x @ w.t()) <= 1e-5


def test_out_dtype_fp32_from_bf16_operands():
    x, w = randn((16, 64), 9, torch.bfloat16), randn((32, 64), 10, torch.bfloat16)
    y = gemm(x, w, out_dtype=torch.float32)
    assert y.dtype == torch.float32
    assert relerr(y, x.float() @ w.float().t()) <= 1e-5  # bf16 products are exact in fp32


# -- FP8 per-tensor -------------------------------------------------------------------------------


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("x_shape", [(64, 96), (4, 9, 48)])
def test_fp8_per_tensor_fprop_dgrad_wgrad(out_dtype, x_shape):
    k, n = x_shape[-1], 40
    tol = 1e-5 if out_dtype == torch.float32 else 1e-2
    x = randn(x_shape, 11, torch.bfloat16)
    w = randn((n, k), 12, torch.bfloat16)
    dy = randn((*x_shape[:-1], n), 13, torch.bfloat16, scale=1e-3)
    xq, wq, dyq = per_tensor(x), per_tensor(w), per_tensor(dy, E5M2)  # HYBRID: grads in E5M2

    y = gemm(xq, wq, out_dtype=out_dtype, use_split_accumulator=False)
    assert y.dtype == out_dtype and y.shape == (*x_shape[:-1], n)
    assert relerr(y, dq(xq) @ dq(wq).t()) <= tol
    assert relerr(y, x.float() @ w.float().t()) <= 0.1

    dx = gemm_dgrad(dyq, wq, out_dtype=out_dtype)  # w's column-wise copy
    assert dx.shape == x.shape
    assert relerr(dx, dq(dyq) @ dq(wq)) <= tol
    assert relerr(dx, dy.float() @ w.float()) <= 0.1

    dw = gemm_wgrad(dyq, xq, out_dtype=out_dtype)  # both column-wise copies
    dy2, x2 = dq(dyq).reshape(-1, n), dq(xq).reshape(-1, k)
    assert dw.shape == (n, k)
    assert relerr(dw, dy2.t() @ x2) <= tol
    assert relerr(dw, dy.float().reshape(-1, n).t() @ x.float().reshape(-1, k)) <= 0.1


def test_fp8_default_out_dtype_is_the_quantized_tensors_dtype():
    xq = per_tensor(randn((16, 32), 14, torch.float16))
    wq = per_tensor(randn((8, 32), 15, torch.float16))
    assert gemm(xq, wq).dtype == torch.float16


def test_fp8_bias_and_gelu():
    x, w = randn((48, 64), 16), randn((32, 64), 17)
    bias = randn((32,), 18)
    xq, wq = per_tensor(x), per_tensor(w)
    pre_ref = dq(xq) @ dq(wq).t() + bias
    y = gemm(xq, wq, bias=bias, out_dtype=torch.float32)
    assert relerr(y, pre_ref) <= 1e-5
    g, pre = gemm(xq, wq, bias=bias, out_dtype=torch.float32, gelu=True)
    assert relerr(pre, pre_ref) <= 1e-5
    assert relerr(g, gelu_tanh(pre_ref)) <= 1e-5
    # bf16 output with an fp32 bias (te accepts the output's dtype or fp32)
    yb = gemm(xq, wq, bias=bias, out_dtype=torch.bfloat16)
    assert yb.dtype == torch.bfloat16 and relerr(yb, pre_ref) <= 1e-2


# -- FP8 block scaling ----------------------------------------------------------------------------


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("x_shape,n", [((256, 384), 256), ((2, 100, 200), 136)])
def test_fp8_block_fprop_dgrad_wgrad(out_dtype, x_shape, n):
    k = x_shape[-1]
    tol = 1e-5 if out_dtype == torch.float32 else 1e-2
    x = randn(x_shape, 19, torch.bfloat16)
    w = randn((n, k), 20, torch.bfloat16)
    dy = randn((*x_shape[:-1], n), 21, torch.bfloat16)
    xq, wq, dyq = block(x, 1), block(w, 2), block(dy, 1)  # 1x128 activations/grads, 128x128 weights

    y = gemm(xq, wq, out_dtype=out_dtype)  # 1x128 x 128x128
    assert y.shape == (*x_shape[:-1], n)
    assert relerr(y, dq(xq) @ dq(wq).t()) <= tol
    assert relerr(y, x.float() @ w.float().t()) <= 0.1

    dx = gemm_dgrad(dyq, wq, out_dtype=out_dtype)  # 1x128 x 128x128 (w's column-wise copy)
    assert relerr(dx, dq(dyq) @ dq(wq)) <= tol
    assert relerr(dx, dy.float() @ w.float()) <= 0.1

    dw = gemm_wgrad(dyq, xq, out_dtype=out_dtype)  # 1x128 x 1x128, both column-wise copies
    # The column-wise copies have their own (128x1) blocks: dequantize them, not the row-wise.
    dy_c = te.Float8BlockQuantizer(E4M3, block_scaling_dim=1, rowwise=False)(dy)
    x_c = te.Float8BlockQuantizer(E4M3, block_scaling_dim=1, rowwise=False)(x)
    dy2, x2 = dq(dy_c).reshape(-1, n), dq(x_c).reshape(-1, k)
    assert relerr(dw, dy2.t() @ x2) <= tol
    assert relerr(dw, dy.float().reshape(-1, n).t() @ x.float().reshape(-1, k)) <= 0.1


# -- epilogues, out, accumulate -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gelu_returns_activation_and_pre_activation(dtype):
    x, w, bias = randn((2, 7, 40), 22, dtype), randn((24, 40), 23, dtype), randn((24,), 24, dtype)
    g, pre = gemm(x, w, bias=bias, gelu=True)
    pre_ref = F.linear(x.float(), w.float(), bias.float())
    assert g.shape == pre.shape == (2, 7, 24) and g.dtype == pre.dtype == dtype
    assert relerr(pre, pre_ref) <= HP_TOL[dtype]
    assert relerr(g, gelu_tanh(pre_ref)) <= HP_TOL[dtype]
    g2, pre2 = gemm(x, w, gelu=True)  # without bias
    assert relerr(g2, gelu_tanh(x.float() @ w.float().t())) <= HP_TOL[dtype]
    assert relerr(pre2, x.float() @ w.float().t()) <= HP_TOL[dtype]


def test_dgrad_with_gelu_input_is_the_gradient_through_gelu():
    # LayerNormMLP's fc2 dgrad: d(pre) = (dy @ w2) * gelu'(pre)
    h, w1, w2 = randn((3, 5, 32), 25), randn((48, 32), 26), randn((24, 48), 27)
    _, pre = gemm(h, w1, gelu=True)
    dy = randn((3, 5, 24), 28)
    dpre = gemm_dgrad(dy, w2, gelu_input=pre)
    assert relerr(dpre, (dy @ w2) * dgelu_tanh(pre)) <= 1e-5
    # and it is autograd's gradient of gelu(h @ w1^T) @ w2^T w.r.t. the pre-activation
    pre_ref = (h @ w1.t()).requires_grad_()
    (gelu_tanh(pre_ref) @ w2.t()).backward(dy)
    assert relerr(dpre, pre_ref.grad) <= 1e-5


def test_accumulate_adds_into_out_twice():
    dy, x = randn((33, 20), 29, torch.bfloat16), randn((33, 36), 30, torch.bfloat16)
    init = randn((20, 36), 31)
    main_grad = init.clone()
    r1 = gemm_wgrad(dy, x, out=main_grad, accumulate=True)
    r2 = gemm_wgrad(dy, x, out=main_grad, accumulate=True)
    assert r1 is main_grad and r2 is main_grad
    prod = dy.float().t() @ x.float()
    assert relerr(main_grad, init + 2 * prod) <= 1e-5
    # fprop/dgrad take the same out/accumulate
    y = torch.ones(4, 20)
    gemm(randn((4, 36), 32), randn((20, 36), 33), out=y, accumulate=True)
    assert relerr(y, 1 + randn((4, 36), 32) @ randn((20, 36), 33).t()) <= 1e-5
    dx = torch.full((33, 36), 2.0)
    w = randn((20, 36), 34)
    gemm_dgrad(dy.float(), w, out=dx, accumulate=True)
    assert relerr(dx, 2 + dy.float() @ w) <= 1e-5


def test_fp8_wgrad_accumulates_into_fp32_main_grad():
    dy, x = randn((64, 32), 35), randn((64, 48), 36)
    dyq, xq = per_tensor(dy, E5M2), per_tensor(x)
    main_grad = torch.zeros(32, 48)
    for _ in range(2):
        gemm_wgrad(dyq, xq, out=main_grad, accumulate=True)
    assert relerr(main_grad, 2 * dq(dyq).t() @ dq(xq)) <= 1e-5


def test_out_without_accumulate_overwrites():
    x, w = randn((8, 16), 37), randn((12, 16), 38)
    out = torch.full((8, 12), float("nan"))
    assert gemm(x, w, out=out) is out
    assert relerr(out, x @ w.t()) <= 1e-5


def test_wgrad_bias_grad_is_column_sum_of_dy():
    dy, x = randn((4, 6, 20), 39), randn((4, 6, 12), 40)
    dw, db = gemm_wgrad(dy, x, bias_grad=True)
    assert torch.allclose(db, dy.sum((0, 1)), rtol=1e-5, atol=1e-5)
    assert relerr(db, dy.reshape(-1, 20).sum(0)) <= 1e-6
    # with accumulate, dbias is fresh while dw accumulates
    main = torch.zeros(20, 12)
    _, db1 = gemm_wgrad(dy, x, bias_grad=True, out=main, accumulate=True)
    _, db2 = gemm_wgrad(dy, x, bias_grad=True, out=main, accumulate=True)
    assert torch.equal(db1, db2) and relerr(main, 2 * dw) <= 1e-6
    # FP8 dy: the column sums of the dequantized (column-wise) copy
    dyq = per_tensor(dy, E5M2)
    _, dbq = gemm_wgrad(dyq, per_tensor(x), bias_grad=True, out_dtype=torch.float32)
    assert relerr(dbq, dq(dyq).reshape(-1, 20).sum(0)) <= 1e-5


@pytest.mark.parametrize("split", [None, True, False])
def test_use_split_accumulator_values(split):
    x, w = randn((16, 32), 41), randn((8, 32), 42)
    xq, wq = per_tensor(x), per_tensor(w)
    y = gemm(xq, wq, out_dtype=torch.float32, use_split_accumulator=split)
    assert relerr(y, dq(xq) @ dq(wq).t()) <= 1e-5


# -- errors ---------------------------------------------------------------------------------------


def test_k_mismatch_names_the_dimensions():
    with pytest.raises(ValueError, match=r"b: expected K = 64 .* got K = 32"):
        gemm(randn((16, 64), 1), randn((48, 32), 2))
    with pytest.raises(ValueError, match="expected K"):
        gemm_dgrad(randn((16, 48), 1), randn((40, 32), 2))
    with pytest.raises(ValueError, match="expected K"):
        gemm_wgrad(randn((16, 48), 1), randn((15, 32), 2))


def test_wrong_dtypes():
    x, w = randn((16, 32), 1, torch.bfloat16), randn((8, 32), 2)
    with pytest.raises(ValueError, match="high-precision operands share one dtype"):
        gemm(x, w)
    with pytest.raises(TypeError, match="x: expected one of float32, float16, bfloat16"):
        gemm(x.double(), w)
    with pytest.raises(ValueError, match="does not mix high-precision and FP8 operands"):
        gemm(per_tensor(x), w)
    with pytest.raises(ValueError, match=r"E5M2 x E5M2 is not a supported FP8 GEMM"):
        gemm(per_tensor(x, E5M2), per_tensor(w, E5M2))
    with pytest.raises(ValueError, match="both FP8 operands are per-tensor or both block-scaled"):
        gemm(per_tensor(x), block(w, 1))
    with pytest.raises(TypeError, match="x: expected a torch.Tensor or a te quantized tensor"):
        gemm([[1.0]], w)


def test_two_2d_block_operands_is_an_error():
    x, w = randn((128, 128), 1), randn((128, 128), 2)
    with pytest.raises(ValueError, match="at most one block_2d"):
        gemm(block(x, 2), block(w, 2))


def test_missing_copy_is_named():
    x, w = randn((16, 32), 1), randn((8, 32), 2)
    w_row = te.Float8CurrentScalingQuantizer(E4M3, "cpu", columnwise=False)(w)
    with pytest.raises(ValueError, match=r"b->columnwise_data: trans_b = 0 needs the column-wise copy"):
        gemm_dgrad(per_tensor(randn((16, 8), 3)), w_row)
    x_col = te.Float8CurrentScalingQuantizer(E4M3, "cpu", rowwise=False)(x)
    with pytest.raises(ValueError, match=r"a->rowwise_data: trans_a = 0 needs the row-wise copy"):
        gemm(x_col, per_tensor(w))
    # 1x128 blocks without the column-wise copy cannot feed a wgrad
    dy_row = te.Float8BlockQuantizer(E4M3, block_scaling_dim=1, columnwise=False)(randn((16, 8), 4))
    with pytest.raises(ValueError, match="a->columnwise_data"):
        gemm_wgrad(dy_row, block(x, 1))


def test_out_and_accumulate_errors():
    x, w = randn((8, 16), 1), randn((12, 16), 2)
    with pytest.raises(ValueError, match="accumulate: True adds the product into out=, but out is None"):
        gemm(x, w, accumulate=True)
    with pytest.raises(ValueError, match="out: expected out_dtype torch.bfloat16, got a torch.float32"):
        gemm(x, w, out=torch.empty(8, 12), out_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="out: expected a contiguous tensor"):
        gemm(x, w, out=torch.empty(12, 8).t())
    with pytest.raises(ValueError, match=r"d->rowwise_data.shape: expected \[8, 12\]"):
        gemm(x, w, out=torch.empty(8, 13))


def test_operand_ranks_are_named():
    """A weight that is not [N, K] was te_gemm's error about the output d, which the caller never
    passed; a 0-dim wgrad operand was an IndexError."""
    x, dy = randn((8, 16), 1), randn((8, 12), 2)
    with pytest.raises(
        ValueError, match=r"functional.gemm: w: expected a 2-D weight \[N, K\], got shape \(16,\)"
    ):
        gemm(x, randn((16,), 3))
    with pytest.raises(
        ValueError, match=r"functional.gemm: w: expected a 2-D weight .*got shape \(2, 12, 16\)"
    ):
        gemm(x, randn((2, 12, 16), 3))
    with pytest.raises(
        ValueError, match=r"functional.gemm_dgrad: w: expected a 2-D weight .*got shape \(12,\)"
    ):
        gemm_dgrad(dy, randn((12,), 3))
    with pytest.raises(
        ValueError, match=r"functional.gemm_wgrad: x: expected at least 1 dim .*got shape \(\)"
    ):
        gemm_wgrad(dy, torch.tensor(1.0))
    # a 1-D x is one row, as in F.linear
    x1, w = randn((16,), 4), randn((12, 16), 5)
    assert relerr(gemm(x1, w), w @ x1) <= 1e-5


def test_requires_grad_is_refused_outside_no_grad():
    x, w = randn((8, 16), 1), randn((12, 16), 2).requires_grad_()
    with pytest.raises(RuntimeError, match="functional.gemm is not differentiable"):
        gemm(x, w)
    with torch.no_grad():
        assert relerr(gemm(x, w), x @ w.detach().t()) <= 1e-5


# -- the hot path and torch.compile ---------------------------------------------------------------


def test_eager_calls_do_not_go_through_the_dispatcher(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("eager gemm went through torch.ops.te.gemm")

    monkeypatch.setattr(torch.ops.te, "gemm", boom)
    x, w = randn((2, 8, 32), 1), randn((16, 32), 2)
    assert relerr(gemm(x, w), x @ w.t()) <= 1e-5
    assert gemm(per_tensor(x), per_tensor(w)).shape == (2, 8, 16)
    assert gemm_dgrad(per_tensor(randn((2, 8, 16), 3), E5M2), per_tensor(w)).shape == x.shape
    gemm_wgrad(per_tensor(randn((2, 8, 16), 3), E5M2), per_tensor(x), bias_grad=True)


def test_gemm_configs_are_cached_per_key():
    c1 = _kernels.gemm_config(False, True, False, 0, False, -1)
    assert _kernels.gemm_config(False, True, False, 0, False, -1) is c1
    assert _kernels.gemm_config(False, False, False, 0, False, -1) is not c1
    assert (c1.trans_a, c1.trans_b, c1.beta, c1.use_split_accumulator) == (0, 1, 0.0, -1)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_equals_eager_high_precision(backend):
    torch._dynamo.reset()
    x, w, bias = randn((2, 24, 40), 1), randn((36, 40), 2), randn((36,), 3)
    w2 = randn((20, 36), 8)
    dy = randn((2, 24, 20), 4)

    def f(x, w, bias, dy, main_grad):  # a Linear + gelu layer's three GEMMs
        g, pre = gemm(x, w, bias=bias, gelu=True)
        dpre = gemm_dgrad(dy, w2, gelu_input=pre)
        dx = gemm_dgrad(dpre, w)
        dw, db = gemm_wgrad(dpre, x, bias_grad=True, out=main_grad, accumulate=True)
        y = gemm(x, w, use_split_accumulator=True, out_dtype=torch.bfloat16)
        return g * 2, pre, dpre, dx, dw, db, y

    cf = torch.compile(f, fullgraph=True, backend=backend)
    m_eager, m_comp = torch.ones(36, 40), torch.ones(36, 40)
    want = f(x, w, bias, dy, m_eager)
    got = cf(x, w, bias, dy, m_comp)
    for g, wt in zip(got, want, strict=True):
        assert g.shape == wt.shape and g.dtype == wt.dtype
        assert torch.allclose(g, wt, rtol=1e-6, atol=1e-6)
    assert torch.equal(m_comp, m_eager)  # the compiled wgrad accumulated into the caller's tensor


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("recipe", ["per_tensor", "block"])
def test_compiled_equals_eager_quantized(backend, recipe):
    torch._dynamo.reset()
    x, w = randn((2, 64, 128), 5, torch.bfloat16), randn((96, 128), 6, torch.bfloat16)
    dy = randn((2, 64, 96), 7, torch.bfloat16)
    if recipe == "per_tensor":
        qx = te.Float8CurrentScalingQuantizer(E4M3, "cpu")
        qw = te.Float8CurrentScalingQuantizer(E4M3, "cpu")
        qg = te.Float8CurrentScalingQuantizer(E5M2, "cpu")
    else:
        qx = te.Float8BlockQuantizer(E4M3, block_scaling_dim=1)
        qw = te.Float8BlockQuantizer(E4M3, block_scaling_dim=2)
        qg = te.Float8BlockQuantizer(E4M3, block_scaling_dim=1)

    def quantize_inside(x, w, dy, main_grad):  # quantizers and GEMMs in one graph
        xq, wq, dyq = qx(x), qw(w), qg(dy)
        y = gemm(xq, wq, use_split_accumulator=False)
        dx = gemm_dgrad(dyq, wq, out_dtype=torch.float32)
        gemm_wgrad(dyq, xq, out=main_grad, accumulate=True)
        return y, dx

    def quantized_args(xq, wq, dyq):  # quantized tensors as graph inputs
        return gemm(xq, wq, out_dtype=torch.float32), gemm_wgrad(dyq, xq, out_dtype=torch.bfloat16)

    m_eager, m_comp = torch.zeros(96, 128), torch.zeros(96, 128)
    want = quantize_inside(x, w, dy, m_eager)
    got = torch.compile(quantize_inside, fullgraph=True, backend=backend)(x, w, dy, m_comp)
    for g, wt in zip(got, want, strict=True):
        assert g.shape == wt.shape and g.dtype == wt.dtype and torch.equal(g, wt)
    assert torch.equal(m_comp, m_eager)
    xq, wq, dyq = qx(x), qw(w), qg(dy)
    want = quantized_args(xq, wq, dyq)
    got = torch.compile(quantized_args, fullgraph=True, backend=backend)(xq, wq, dyq)
    for g, wt in zip(got, want, strict=True):
        assert g.shape == wt.shape and g.dtype == wt.dtype and torch.equal(g, wt)


def test_compiled_graph_calls_te_gemm():
    torch._dynamo.reset()
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    x, w = randn((8, 32), 1), randn((16, 32), 2)
    y = torch.compile(lambda x, w: gemm(x, w), fullgraph=True, backend=backend)(x, w)
    assert "te.gemm" in seen or "te.gemm.default" in seen
    assert relerr(y, x @ w.t()) <= 1e-5
