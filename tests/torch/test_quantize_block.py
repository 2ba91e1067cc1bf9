"""Float8BlockQuantizer (1x128 and 128x128) against the plain-torch block oracle."""

import pytest
import te_torch as te
import torch

SHAPES = [(1, 1), (7, 13), (1000, 3), (2, 3, 5), (129, 257), (256, 384), (3, 130, 129)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


def _roundup(a, b):
    return -(-a // b) * b


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("pow2", [True, False])
def test_block_1d_matches_oracle(oracle, shape, dtype, fp8_dtype, pow2):
    x = oracle.random_input(shape, dtype, seed=2)
    q = te.Float8BlockQuantizer(fp8_dtype, block_scaling_dim=1, force_pow_2_scales=pow2)
    qt = q(x)
    assert isinstance(qt, te.Float8BlockwiseQTensor) and not qt._is_2D_scaled
    assert qt.shape == x.shape and qt.dtype == dtype
    x2 = oracle.as_matrix(x)
    m, k = x2.shape
    want_q, want_si = oracle.block_1d(x2, fp8_dtype, pow2, 0.0)  # [M, K], [M, kb]
    kb = want_si.shape[1]
    assert qt._rowwise_data.shape == x.shape
    assert torch.equal(oracle.bits(qt._rowwise_data.reshape(m, k)), oracle.bits(want_q))
    # row-wise scales stored transposed: [ceil(K/128), roundup(M, 4)]
    assert qt._rowwise_scale_inv.shape == (kb, _roundup(m, 4))
    assert torch.equal(qt._rowwise_scale_inv[:, :m], want_si.t())
    # column-wise copy == quantizing x.T row-wise (its own 128x1 blocks along the columns)
    col_q, col_si = oracle.block_1d(x2.t().contiguous(), fp8_dtype, pow2, 0.0)  # [K, M], [K, mb]
    mb = col_si.shape[1]
    assert qt._columnwise_data.shape == (k, m)
    assert torch.equal(oracle.bits(qt._columnwise_data), oracle.bits(col_q))
    assert qt._columnwise_scale_inv.shape == (mb, _roundup(k, 4))
    assert torch.equal(qt._columnwise_scale_inv[:, :k], col_si.t())
    if pow2:  # scale_inv of a power-of-two scale is a power of two
        si = qt._rowwise_scale_inv[:, :m]
        assert torch.equal(si, 2.0 ** torch.log2(si).round())
    # dequantize == q * scale_inv per block, in the source dtype
    expand = want_si.repeat_interleave(128, dim=1)[:, :k]
    exact = (want_q.float() * expand).to(dtype).reshape(shape)
    assert torch.equal(qt.dequantize(), exact)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("pow2", [True, False])
def test_block_2d_matches_oracle(oracle, shape, dtype, fp8_dtype, pow2):
    x = oracle.random_input(shape, dtype, seed=3)
    q = te.Float8BlockQuantizer(fp8_dtype, force_pow_2_scales=pow2)  # block_scaling_dim=2
    qt = q(x)
    assert qt._is_2D_scaled
    x2 = oracle.as_matrix(x)
    m, k = x2.shape
    want_q, want_si = oracle.block_2d(x2, fp8_dtype, pow2, 0.0)  # [M, K], [mb, kb]
    mb, kb = want_si.shape
    assert torch.equal(oracle.bits(qt._rowwise_data.reshape(m, k)), oracle.bits(want_q))
    assert qt._rowwise_scale_inv.shape == (mb, _roundup(kb, 4))
    assert torch.equal(qt._rowwise_scale_inv[:, :kb], want_si)
    # 128x128 tiles: the column-wise copy is exactly the transpose, tile scales transposed
    assert qt._columnwise_data.shape == (k, m)
    assert torch.equal(oracle.bits(qt._columnwise_data), oracle.bits(want_q.t()))
    assert qt._columnwise_scale_inv.shape == (kb, _roundup(mb, 4))
    assert torch.equal(qt._columnwise_scale_inv[:, :mb], want_si.t())
    tile_si = want_si.repeat_interleave(128, 0).repeat_interleave(128, 1)[:m, :k]
    assert torch.equal(qt.dequantize(), (want_q.float() * tile_si).to(dtype).reshape(shape))


def test_block_pow2_rule_is_mantissa_clear(oracle):
    # one 1x128 block with amax 3.0: scale 448/3 = 149.33.. -> pow2 128; f32 scale keeps 149.33
    x = torch.zeros(1, 128)
    x[0, 5] = -3.0
    x[0, 7] = 1.0
    for pow2, want in ((True, 128.0), (False, 448.0 / 3.0)):
        q = te.Float8BlockQuantizer(torch.float8_e4m3fn, block_scaling_dim=1, force_pow_2_scales=pow2)
        qt = q(x)
        want_scale = torch.tensor([want], dtype=torch.float32)
        assert torch.equal(qt._rowwise_scale_inv[0, :1], 1.0 / want_scale)
        want_q = oracle.cast(torch.tensor(-3.0), want_scale, torch.float8_e4m3fn)
        assert qt._rowwise_data.float()[0, 5] == want_q.float()


def test_block_epsilon_and_zero_blocks():
    x = torch.zeros(2, 256)
    x[0, :128] = 1e-3  # amax 1e-3 < epsilon 0.5
    q = te.Float8BlockQuantizer(
        torch.float8_e4m3fn, block_scaling_dim=1, amax_epsilon=0.5, force_pow_2_scales=False
    )
    qt = q(x)
    si = qt._rowwise_scale_inv  # [2 blocks, roundup(2,4)]
    assert torch.equal(si[0, 0], 1.0 / torch.tensor(448.0 / 0.5))  # epsilon-limited block
    assert torch.equal(si[1, 0], 1.0 / torch.tensor(448.0 / 0.5))  # zero block: max(0, eps)
    q0 = te.Float8BlockQuantizer(torch.float8_e4m3fn, block_scaling_dim=1)
    assert torch.equal(q0(x)._rowwise_scale_inv[1, :2], torch.ones(2))  # amax 0 -> scale 1


def test_block_usage_and_update_usage(oracle):
    x = oracle.random_input((200, 260), torch.bfloat16, seed=4)
    full = te.Float8BlockQuantizer(torch.float8_e4m3fn, block_scaling_dim=1)(x)
    row = te.Float8BlockQuantizer(torch.float8_e4m3fn, block_scaling_dim=1, columnwise=False)(x)
    assert row._columnwise_data is None and row._columnwise_scale_inv is None
    with pytest.raises(RuntimeError, match="column-wise copy is missing and cannot be made"):
        row.update_usage(columnwise_usage=True)
    col = te.Float8BlockQuantizer(torch.float8_e4m3fn, block_scaling_dim=1, rowwise=False)(x)
    assert col._rowwise_data is None
    with pytest.raises(RuntimeError, match="row-wise copy is missing"):
        col.update_usage(rowwise_usage=True)
    assert torch.equal(oracle.bits(col._columnwise_data), oracle.bits(full._columnwise_data))
    # dequantize from the column-wise copy alone: its own blocks, close to x
    assert (col.dequantize().float() - x.float()).abs().max() <= x.float().abs().max() * 2**-4
    full.update_usage(rowwise_usage=False)
    assert full._rowwise_data is None and full._rowwise_scale_inv is None
    with pytest.raises(ValueError, match="cannot both be False"):
        full.update_usage(columnwise_usage=False)

    # 2D: either copy is derived exactly from the other
    q2 = te.Float8BlockQuantizer(torch.float8_e4m3fn, block_scaling_dim=2)
    both = q2(x)
    q2.set_usage(columnwise=False)
    r = q2(x)
    r.update_usage(columnwise_usage=True)
    assert torch.equal(oracle.bits(r._columnwise_data), oracle.bits(both._columnwise_data))
    mb, kb = 2, 3
    assert torch.equal(r._columnwise_scale_inv[:, :mb], both._columnwise_scale_inv[:, :mb])
    r.update_usage(rowwise_usage=False)
    r.update_usage(rowwise_usage=True)
    assert torch.equal(oracle.bits(r._rowwise_data), oracle.bits(both._rowwise_data))
    assert torch.equal(r._rowwise_scale_inv[:, :kb], both._rowwise_scale_inv[:, :kb])
