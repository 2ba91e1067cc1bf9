"""te.quantized_model_init on CPU: weights stored quantized only (type, copies, bytes), GEMMs that
read the stored weight (against fp32 math on the dequantized operands), gradients in the nominal
dtype, the fp32 master-weights training recipe against the same model trained normally, state_dict
round trips, and the errors."""

import copy
import io

import pytest
import te_torch as te
import torch
import torch.nn.functional as F
from _module_ref import RECIPES, deq, ref_quantizers, rel
from te_torch import recipe

QTYPE = {"delayed": te.Float8Tensor, "current": te.Float8Tensor, "block": te.Float8BlockwiseQTensor}


def _init(std):
    return lambda w: w.normal_(0.0, std)


def _inner_bytes(t) -> int:
    names, _ = t.__tensor_flatten__()
    return sum(getattr(t, n).numel() * getattr(t, n).element_size() for n in names)


@pytest.mark.parametrize("name", list(RECIPES))
def test_weight_is_stored_quantized_only(name):
    r = RECIPES[name]()
    torch.manual_seed(0)
    plain = te.Linear(256, 128, device="cpu")
    torch.manual_seed(0)
    with te.quantized_model_init(recipe=r, preserve_high_precision_init_val=True):
        m = te.Linear(256, 128, device="cpu")
    w = m.weight
    assert type(w) is QTYPE[name] and isinstance(w, torch.nn.Parameter) and w.requires_grad
    assert w.dtype == torch.float32 and w.shape == (128, 256)
    assert [p is w for p in m.parameters()] == [True, False]
    # the exact initial value, and the stored weight is its quantization (both copies)
    init = w.get_high_precision_init_val()
    assert init.device.type == "cpu" and torch.equal(init, plain.weight.detach())
    _, qw, _ = ref_quantizers(r)
    if name == "delayed":  # per-tensor weights are current-scaled under every per-tensor recipe
        _, qw, _ = ref_quantizers(recipe.Float8CurrentScaling())
    assert torch.equal(w.dequantize(), deq(qw, init, True))
    if name == "block":
        assert w._rowwise_data is not None and w._columnwise_data is not None
    else:
        assert w._data.dtype == torch.float8_e4m3fn and w._transpose.shape == (256, 128)
    # FP8 bytes (two copies) plus fp32 scales: half the fp32 weight, nothing else kept
    fp32_bytes = 128 * 256 * 4
    # one fp32 scale; or 128x128 tiles: 1x2 row-wise scales padded to [1, 4], 2x1 column-wise [2, 4]
    scale_bytes = 4 if name != "block" else (1 * 4 + 2 * 4) * 4
    assert _inner_bytes(w) == fp32_bytes // 2 + scale_bytes
    w.clear_high_precision_init_val()
    assert w.get_high_precision_init_val() is None


@pytest.mark.parametrize("name", list(RECIPES))
def test_gemms_read_the_stored_weight(name):
    """Under autocast y, dx, dw match fp32 math on the dequantized stored weight and te's
    quantization of x and dy: the weight is not quantized again (under DelayedScaling a
    re-quantization with the fresh scale 1 would leave these 0.02-sized weights subnormal)."""
    r = RECIPES[name]()
    torch.manual_seed(1)
    with te.quantized_model_init(recipe=r):
        m = te.Linear(160, 192, device="cpu", init_method=_init(0.02))
    with torch.no_grad():
        m.bias.normal_(0, 0.5)
    x = torch.randn(2, 24, 160, requires_grad=True)
    dy = torch.randn(2, 24, 192)
    with te.autocast(recipe=r):
        y = m(x)
    y.backward(dy)
    qx, _, qg = ref_quantizers(r)
    wd = m.weight.dequantize()
    y_ref = deq(qx, x.detach(), True) @ wd.T + m.bias.detach()
    dx_ref = deq(qg, dy, True) @ wd
    dw_ref = deq(qg, dy, False).reshape(-1, 192).T @ deq(qx, x.detach(), False).reshape(-1, 160)
    assert rel(y, y_ref) <= 1e-5 and rel(x.grad, dx_ref) <= 1e-5
    assert m.weight.grad.dtype == torch.float32 and type(m.weight.grad) is torch.Tensor
    assert rel(m.weight.grad, dw_ref) <= 1e-5
    assert torch.allclose(m.bias.grad, dy.reshape(-1, 192).sum(0), rtol=1e-5, atol=1e-4)


def test_outside_autocast_runs_the_dequantized_weight_in_high_precision():
    with te.quantized_model_init(recipe=recipe.Float8CurrentScaling()):
        m = te.Linear(64, 48, device="cpu")
    x = torch.randn(10, 64, dtype=torch.bfloat16, requires_grad=True)
    y = m(x)
    w = m.weight.dequantize()
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, F.linear(x.detach(), w.bfloat16(), m.bias.detach().bfloat16()))
    dy = torch.randn_like(y)
    y.backward(dy)
    assert m.weight.grad.dtype == torch.float32  # the parameter's nominal dtype
    assert torch.equal(m.weight.grad, (dy.T @ x.detach()).float())
    assert torch.equal(x.grad, dy @ w.bfloat16())


@pytest.mark.parametrize("in_autocast", [True, False], ids=["autocast", "high_precision"])
def test_bf16_params_and_main_grad(in_autocast):
    r = recipe.Float8CurrentScaling()
    with te.quantized_model_init(recipe=r):
        m = te.Linear(64, 32, device="cpu", params_dtype=torch.bfloat16, fuse_wgrad_accumulation=True)
    assert m.weight.dtype == torch.bfloat16
    m.weight.main_grad = torch.ones(32, 64)
    x = torch.randn(16, 64, dtype=torch.bfloat16)
    dy = torch.randn(16, 32, dtype=torch.bfloat16)
    with te.autocast(enabled=in_autocast, recipe=r):
        y = m(x)
    y.backward(dy)
    assert m.weight.grad is None
    qx, _, qg = ref_quantizers(r)
    want = dy.float().T @ x.float() if not in_autocast else deq(qg, dy, False).T @ deq(qx, x, False)
    assert rel(m.weight.main_grad - 1, want) <= 1e-5


def _model(r, qinit: bool):
    torch.manual_seed(3)
    with te.quantized_model_init(enabled=qinit, recipe=r):
        return torch.nn.Sequential(
            te.LayerNormLinear(32, 64, device="cpu", init_method=_init(0.2)),
            torch.nn.GELU(),
            te.Linear(64, 16, device="cpu", init_method=_init(0.2)),
        )


def _train(model, params, step_hook, r, steps=6):
    torch.manual_seed(4)
    x = torch.randn(64, 32)
    target = torch.tanh(x @ torch.randn(32, 16) * 0.3)
    opt = torch.optim.Adam(params, lr=2e-2)
    losses = []
    for _ in range(steps):
        with te.autocast(recipe=r):
            loss = F.mse_loss(model(x), target)
        loss.backward()
        step_hook(opt)
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("name", list(RECIPES))
def test_master_weight_training_matches_the_normally_built_model(name):
    """The docstring's recipe: fp32 masters outside the model, the optimizer on them with the FP8
    parameters' gradients, then ``p.quantize_(master)``. Against the same model built normally
    (its weights set to the same values) and trained under autocast: identical for the recipes
    whose weight quantization is the same (current, block); close under DelayedScaling, whose
    normally built weights use the delayed scale instead."""
    r = RECIPES[name]()
    qmodel, plain = _model(r, True), _model(r, False)
    qparams = [p for p in qmodel.parameters() if isinstance(p, te.QuantizedTensor)]
    assert len(qparams) == 2
    masters = [p.dequantize().float().requires_grad_() for p in qparams]
    others = [p for p in qmodel.parameters() if not isinstance(p, te.QuantizedTensor)]
    with torch.no_grad():
        for pq, pp in zip(qmodel.parameters(), plain.parameters(), strict=True):
            pp.copy_(pq.dequantize() if isinstance(pq, te.QuantizedTensor) else pq)

    def master_step(opt):
        with torch.no_grad():
            for p, m in zip(qparams, masters, strict=True):
                m.grad, p.grad = p.grad.float(), None
            opt.step()
            opt.zero_grad()
            for p, m in zip(qparams, masters, strict=True):
                p.quantize_(m)

    def plain_step(opt):
        opt.step()
        opt.zero_grad()

    got = _train(qmodel, masters + others, master_step, r)
    want = _train(plain, list(plain.parameters()), plain_step, r)
    assert all(type(p) is QTYPE[name] for p in qparams)  # still quantized after the steps
    assert got[-1] < 0.6 * got[0], got
    tol = 0.1 if name == "delayed" else 1e-6  # delayed: its first step quantizes W with scale 1
    for g, w in zip(got, want, strict=True):
        assert abs(g - w) <= tol * abs(w), (got, want)
    for p, m in zip(qparams, masters, strict=True):  # the stored weight follows its master
        _, qw, _ = ref_quantizers(r if name != "delayed" else recipe.Float8CurrentScaling())
        assert torch.equal(p.dequantize(), deq(qw, m.detach(), True))


def test_delayed_state_and_quantized_weights_round_trip_through_state_dict():
    r = recipe.DelayedScaling()
    model = _model(r, True)
    qparams = [p for p in model.parameters() if isinstance(p, te.QuantizedTensor)]
    masters = [p.dequantize().float() for p in qparams]

    def step(opt):
        with torch.no_grad():
            for p, m in zip(qparams, masters, strict=True):
                m.sub_(0.01 * p.grad.float())
                p.grad = None
                p.quantize_(m)

    _train(model, [torch.zeros(1, requires_grad=True)], step, r, steps=3)
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    assert type(state["2.weight"]) is te.Float8Tensor
    extra = state["2._extra_state"]
    # input and grad-output scales moved; the weight role's stays 1 (the stored weight has its own)
    assert extra["fwd_scale"][0] != 1 and extra["bwd_scale"][0] != 1 and extra["fwd_scale"][1] == 1
    torch.manual_seed(9)
    fresh = _model(r, True)
    w_before = fresh[2].weight
    fresh.load_state_dict(state)
    assert fresh[2].weight is w_before and type(w_before) is te.Float8Tensor  # copied in place
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True):
        if not isinstance(a, torch.Tensor):  # _extra_state: a dict of tensors
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        elif isinstance(a, te.Float8Tensor):
            assert torch.equal(a._data.view(torch.uint8), b._data.view(torch.uint8))
            assert torch.equal(a._transpose.view(torch.uint8), b._transpose.view(torch.uint8))
            assert torch.equal(a._scale_inv, b._scale_inv)
        else:
            assert torch.equal(a, b)
    x = torch.randn(8, 32)
    with te.autocast(recipe=r):
        assert torch.equal(model(x), fresh(x))  # the next step is the same, bit for bit


def test_state_dicts_load_across_plain_and_quantized_models():
    r = recipe.Float8CurrentScaling()
    torch.manual_seed(0)
    plain = te.Linear(64, 32, device="cpu")
    with te.quantized_model_init(recipe=r):
        q = te.Linear(64, 32, device="cpu")
    q.load_state_dict(plain.state_dict())  # a plain checkpoint is quantized into the FP8 weight
    _, qw, _ = ref_quantizers(r)
    assert type(q.weight) is te.Float8Tensor
    assert torch.equal(q.weight.dequantize(), deq(qw, plain.weight.detach(), True))
    other = te.Linear(64, 32, device="cpu")
    other.load_state_dict(q.state_dict())  # and an FP8 checkpoint loads dequantized
    assert type(other.weight) is torch.nn.Parameter
    assert torch.equal(other.weight.detach(), q.weight.dequantize())


@pytest.mark.parametrize("name", ["current", "block"])
def test_layernorm_mlp_weights_quantized_and_used(name):
    r = RECIPES[name]()
    torch.manual_seed(5)
    with te.quantized_model_init(recipe=r):
        q = te.LayerNormMLP(128, 256, device="cpu")
    assert type(q.fc1_weight) is QTYPE[name] and type(q.fc2_weight) is QTYPE[name]
    plain = te.LayerNormMLP(128, 256, device="cpu")
    with torch.no_grad():
        for pq, pp in zip(q.parameters(), plain.parameters(), strict=True):
            pp.copy_(pq.dequantize() if isinstance(pq, te.QuantizedTensor) else pq)
    x = torch.randn(32, 128)
    with te.autocast(recipe=r):
        # re-quantizing the dequantized weight gives back the stored one: the outputs agree
        y_q, y_p = q(x), plain(x)
    y_q.sum().backward()
    y_p.sum().backward()
    assert rel(y_q, y_p) <= 1e-6
    assert q.fc1_weight.grad.dtype == torch.float32
    assert rel(q.fc1_weight.grad, plain.fc1_weight.grad) <= 1e-6
    assert rel(q.fc2_weight.grad, plain.fc2_weight.grad) <= 1e-6


def test_regions_nest_and_the_old_name_warns():
    assert {"quantized_model_init", "fp8_model_init"} <= set(te.__all__)
    with te.quantized_model_init(recipe=recipe.Float8BlockScaling()):
        with te.quantized_model_init(enabled=False):
            inner = te.Linear(16, 16, device="cpu")
        outer = te.Linear(16, 16, device="cpu")
    after = te.Linear(16, 16, device="cpu")
    assert type(inner.weight) is torch.nn.Parameter and type(after.weight) is torch.nn.Parameter
    assert type(outer.weight) is te.Float8BlockwiseQTensor
    with pytest.warns(DeprecationWarning, match="quantized_model_init"):
        ctx = te.fp8_model_init(enabled=True, recipe=recipe.DelayedScaling())
    with ctx:
        old = te.LayerNormLinear(16, 32, device="cpu")
    assert type(old.weight) is te.Float8Tensor


def test_bad_inputs_say_what_to_do():
    with pytest.raises(TypeError, match="recipe: expected a te.recipe recipe"):
        te.quantized_model_init(recipe="fp8")
    with pytest.raises(TypeError, match="enabled: expected a bool"):
        te.quantized_model_init(enabled="yes")
    with pytest.raises(NotImplementedError, match="CustomRecipe weights are not supported yet"):
        te.quantized_model_init(recipe=recipe.CustomRecipe(qfactory=lambda role: None))
    region = te.quantized_model_init(recipe=recipe.DelayedScaling())
    with region, pytest.raises(RuntimeError, match="already active"):
        with region:
            pass
    with te.quantized_model_init(recipe=recipe.DelayedScaling()):
        with pytest.raises(NotImplementedError, match="parameters_split inside quantized_model_init"):
            te.Linear(16, 32, parameters_split=("a", "b"), device="cpu")
        with pytest.raises(NotImplementedError, match="device='meta'"):
            te.Linear(16, 32, device="meta")
    with te.quantized_model_init(recipe=recipe.Float8BlockScaling()):
        block = te.Linear(128, 128, device="cpu")
    with te.quantized_model_init(recipe=recipe.DelayedScaling()):
        per_tensor = te.Linear(128, 128, device="cpu")
    x = torch.randn(4, 128)
    cases = [
        (block, recipe.DelayedScaling(), "Float8BlockwiseQTensor made for Float8BlockScaling"),
        (per_tensor, recipe.Float8BlockScaling(), "made for DelayedScaling"),
        (block, recipe.Float8BlockScaling(w_block_scaling_dim=1), r"w_block_scaling_dim=2"),
    ]
    for m, r, msg in cases:
        with pytest.raises(ValueError, match=msg) as e, te.autocast(recipe=r):
            m(x)
        assert "te.quantized_model_init(recipe=" in str(e.value)
    per_tensor.weight.update_usage(columnwise_usage=False)
    with (
        pytest.raises(ValueError, match="lacks its column-wise copy"),
        te.autocast(recipe=recipe.DelayedScaling()),
    ):
        per_tensor(x.requires_grad_())
    with te.autocast(recipe=recipe.DelayedScaling()):  # inference needs the row-wise copy only
        y = per_tensor(x.detach())
    assert y.shape == (4, 128)


@pytest.mark.parametrize("name", list(RECIPES))
def test_deepcopy_gives_an_independent_equal_model(name):
    # Users deep-copy models (EMA weights, checkpoint averaging): the stored quantized weight and
    # its quantizer (te_core._C.QuantConfig, cached descriptors) must copy, into new buffers.
    r = RECIPES[name]()
    torch.manual_seed(0)
    with te.quantized_model_init(recipe=r):
        m = te.Linear(128, 64, device="cpu")
    c = copy.deepcopy(m)
    assert type(c.weight) is type(m.weight)
    assert torch.equal(c.weight.dequantize(), m.weight.dequantize())
    x = torch.randn(4, 128)
    with te.autocast(recipe=r):
        y, yc = m(x), c(x)
    assert torch.equal(y, yc)
    with torch.no_grad():
        c.weight.copy_(torch.zeros(64, 128))
    assert torch.count_nonzero(m.weight.dequantize()) > 0
