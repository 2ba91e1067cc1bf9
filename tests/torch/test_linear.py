"""te.Linear on CPU: numerics of every recipe against an emulated reference (te's quantizers,
dequantized, fp32 math: tight) and the fp32 reference (loose), weight caching, main_grad, errors,
torch.compile. Delayed-scaling state over steps lives in test_autocast.py."""

import copy

import pytest
import te_torch as te
import torch
import torch.nn.functional as F
from _module_ref import E4M3, RECIPES, deq, ref_quantizers, rel
from te_torch import recipe


def emulate(r, x, w, b, dy, fwd_scale=None, bwd_scale=None):
    """(y, dx, dw, db) in fp32 from dequantized operands (NUMERICS.md "How to test numerics")."""
    qx, qw, qg = ref_quantizers(r, fwd_scale, bwd_scale)
    k, n = x.shape[-1], w.shape[0]
    y = deq(qx, x, True) @ deq(qw, w, True).T + (0 if b is None else b.float())
    dx = deq(qg, dy, True) @ deq(qw, w, False)
    dw = deq(qg, dy, False).reshape(-1, n).T @ deq(qx, x, False).reshape(-1, k)
    db = dy.float().reshape(-1, n).sum(0)
    return y, dx, dw, db


def run(m, x, dy, r, **kw):
    x = x.detach().clone().requires_grad_(True)
    with te.autocast(recipe=r):
        y = m(x, **kw)
    y.backward(dy)
    return y.detach(), x.grad, m.weight.grad, None if m.bias is None else m.bias.grad


# 37 and 3 x 7 tokens: padded to a multiple of 16 inside (_token_pad), which must change nothing
@pytest.mark.parametrize(
    "shape", [(32, 256), (2, 24, 160), (37, 256), (3, 7, 160)], ids=["2d", "3d", "2d_37", "3d_21"]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(RECIPES))
def test_linear_matches_emulated_and_fp32_reference(name, dtype, shape):
    torch.manual_seed(0)
    r = RECIPES[name]()
    k, n = shape[-1], 192
    m = te.Linear(k, n, params_dtype=dtype, device="cpu")
    with torch.no_grad():
        m.bias.normal_(0, 0.5)
    x = torch.randn(shape, dtype=dtype)
    dy = torch.randn(*shape[:-1], n, dtype=dtype)
    fwd_scale = bwd_scale = None
    if r.delayed():  # a first step sets the scales the checked (second) step uses
        run(m, x * 0.7, dy * 0.7, r)
        m.weight.grad = m.bias.grad = None
        fwd_scale, bwd_scale = m._fwd_state.scale.clone(), m._bwd_state.scale.clone()
        assert (fwd_scale[:2] != 1).all() and (bwd_scale[:1] != 1).all()
    got = run(m, x, dy, r)
    want = emulate(r, x, m.weight.detach(), m.bias.detach(), dy, fwd_scale, bwd_scale)
    tight = 1e-5 if dtype == torch.float32 else 1e-2
    for g, w, what in zip(got, want, ("y", "dx", "dw", "db"), strict=True):
        assert g.dtype == dtype and g.shape == (w.shape if what != "y" else (*shape[:-1], n)), what
        assert rel(g, w) <= tight, (what, rel(g, w))
    # loose: against the unquantized fp32 math (E4M3 forward; HYBRID gradients are E5M2)
    xf, wf = x.float(), m.weight.detach().float()
    yf = F.linear(xf, wf, m.bias.detach().float())
    dxf = dy.float() @ wf
    dwf = dy.float().reshape(-1, n).T @ xf.reshape(-1, k)
    grad_tol = 0.2 if r.fp8_format == recipe.Format.HYBRID else 0.1
    assert rel(got[0], yf) <= 0.1
    assert rel(got[1], dxf) <= grad_tol
    assert rel(got[2], dwf) <= grad_tol
    assert rel(got[0], yf) > 1e-4  # it really was quantized


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(RECIPES))
def test_bias_gradient_fused_with_grad_quantization_changes_nothing(name, dtype):
    """The backward sums the bias gradient in the pass that quantizes dy (te_dbias_quantize):
    dx and dw are bit-identical to a backward without a trainable bias (dy quantized alone),
    and db is the fp32 column sums of dy rounded to the bias dtype."""
    torch.manual_seed(9)
    r = RECIPES[name](**({"amax_history_len": 2} if name == "delayed" else {}))
    base = te.Linear(160, 96, params_dtype=dtype, device="cpu")
    with torch.no_grad():
        base.bias.normal_(0, 0.5)
    x = torch.randn(3, 16, 160, dtype=dtype)
    dy = torch.randn(3, 16, 96, dtype=dtype) * 3
    got = {}
    for trainable in (True, False):
        m = copy.deepcopy(base)
        m.bias.requires_grad_(trainable)
        for step in range(2):  # the second step runs on updated delayed scales
            got[trainable] = run(m, x * (step + 1), dy, r)
            m.weight.grad = m.bias.grad = None
    (dx1, dw1, db1), (dx0, dw0, db0) = got[True][1:], got[False][1:]
    assert torch.equal(dx1, dx0) and torch.equal(dw1, dw0)
    assert db0 is None and db1.dtype == dtype
    want = dy.double().reshape(-1, 96).sum(0)
    assert torch.allclose(db1.double(), want, rtol=1e-6 if dtype == torch.float32 else 2**-8, atol=1e-5)


def test_outside_autocast_is_plain_linear():
    torch.manual_seed(1)
    m = te.Linear(48, 40, device="cpu")
    ref = torch.nn.Linear(48, 40)
    ref.load_state_dict({"weight": m.weight.detach(), "bias": m.bias.detach()})
    x = torch.randn(3, 5, 48)
    assert torch.equal(m(x), ref(x))
    with te.autocast(enabled=False):
        assert torch.equal(m(x), ref(x))


def test_default_parameters_follow_te():
    torch.manual_seed(2)
    m = te.Linear(512, 1024, device="cpu")
    assert m.weight.shape == (1024, 512) and m.weight.dtype == torch.get_default_dtype()
    assert torch.equal(m.bias, torch.zeros(1024))
    assert abs(m.weight.std().item() - 0.023) < 1e-3
    assert m.weight.device.type == te._availability.default_device().type
    m2 = te.Linear(8, 4, bias=False, init_method=torch.nn.init.ones_, device="cpu")
    assert m2.bias is None and torch.equal(m2.weight, torch.ones(4, 8))
    assert [n for n, _ in m.named_parameters()] == ["weight", "bias"]


def test_return_bias_and_parameters_split():
    torch.manual_seed(3)
    m = te.Linear(32, 48, return_bias=True, device="cpu")
    with torch.no_grad():
        m.bias.fill_(0.5)
    x = torch.randn(4, 32)
    out, b = m(x)
    assert b is m.bias and torch.equal(out, x @ m.weight.T)
    s = te.Linear(32, 48, parameters_split=("query_", "key_", "value_"), device="cpu")
    names = [n for n, _ in s.named_parameters()]
    assert names == ["query_weight", "query_bias", "key_weight", "key_bias", "value_weight", "value_bias"]
    w = torch.cat([s.query_weight, s.key_weight, s.value_weight])
    with te.autocast(recipe=recipe.Float8CurrentScaling()):
        y = s(x)
    y.sum().backward()
    assert s.key_weight.grad.shape == (16, 32)
    want = emulate(recipe.Float8CurrentScaling(), x, w.detach(), None, torch.ones(4, 48))[0]
    assert rel(y, want) <= 1e-5
    d = te.Linear(32, 48, parameters_split={"a": 16, "b": 32}, device="cpu")
    assert d.b_weight.shape == (32, 32)


def test_split_parameters_are_read_without_a_copy_while_adjacent():
    """Split parameters are consecutive views of one buffer: the GEMM reads that buffer (no
    concatenation) and each part gets its rows of the gradient. Once a part is replaced the
    module concatenates, with the same numbers."""
    torch.manual_seed(6)
    s = te.Linear(32, 48, parameters_split=("query_", "key_", "value_"), device="cpu")
    x = torch.randn(5, 32, requires_grad=True)
    dy = torch.randn(5, 48)
    seen = []
    orig = torch.nn.functional.linear

    def spy(inp, weight, bias=None):
        seen.append((weight.data_ptr(), None if bias is None else bias.data_ptr()))
        return orig(inp, weight, bias)

    parts = ("query_", "key_", "value_")
    for mode in ("views", "concatenated"):
        w = torch.cat([getattr(s, f"{p}weight") for p in parts]).detach()
        b = torch.cat([getattr(s, f"{p}bias") for p in parts]).detach()
        want = F.linear(x.detach(), w, b)
        for p in parts:
            getattr(s, f"{p}weight").grad = getattr(s, f"{p}bias").grad = None
        seen.clear()
        F.linear = spy
        try:
            y = s(x)
            with torch.no_grad():
                y_inf = s(x)
        finally:
            F.linear = orig
        assert torch.equal(y, want) and torch.equal(y_inf, want)
        adjacent = [(s.query_weight.data_ptr(), s.query_bias.data_ptr())] * 2
        assert (seen == adjacent) == (mode == "views")
        y.backward(dy)
        rows = {"query_": slice(0, 16), "key_": slice(16, 32), "value_": slice(32, 48)}
        for p, r in rows.items():
            torch.testing.assert_close(getattr(s, f"{p}weight").grad, dy[:, r].T @ x.detach())
            torch.testing.assert_close(getattr(s, f"{p}bias").grad, dy[:, r].sum(0))
        s.key_weight = torch.nn.Parameter(s.key_weight.detach().clone())


@pytest.mark.parametrize("name", list(RECIPES))
def test_is_first_microbatch_reuses_cached_weight(name):
    torch.manual_seed(4)
    r = RECIPES[name]()
    m = te.Linear(128, 64, device="cpu")
    x = torch.randn(16, 128)
    with te.autocast(recipe=r):
        y1 = m(x, is_first_microbatch=True)
    w_old = m.weight.detach().clone()
    fwd_scale = None if m._fwd_state is None else m._fwd_state.scale.clone()
    with torch.no_grad():
        m.weight.mul_(3.0)  # the cached FP8 copy must be used, not this
    with te.autocast(recipe=r):
        y2 = m(x, is_first_microbatch=False)
        y3 = m(x, is_first_microbatch=None)
    assert torch.equal(y1, y2) or r.delayed()  # delayed: step 2 quantizes x with a new scale
    # y2 used the old weight quantized in step 1 (delayed: with scale 1); y3 the new weight
    # (delayed: quantized with the scale step 1 produced)
    qx, qw1, _ = ref_quantizers(r, torch.ones(3) if r.delayed() else None)
    _, qw2, _ = ref_quantizers(r, fwd_scale)
    if r.delayed():
        qx = te.Float8Quantizer(fwd_scale[0:1].clone(), torch.zeros(1), E4M3)
    xd = deq(qx, x, True)
    want2 = xd @ deq(qw1, w_old, True).T + m.bias.detach()
    want3 = xd @ deq(qw2, 3 * w_old, True).T + m.bias.detach()
    assert rel(y2, want2) <= 1e-6
    assert rel(y3, want3) <= 1e-6 and rel(y3, y2) > 0.5
    # backward of a cached-weight call uses the cached weight too
    xg = x.clone().requires_grad_(True)
    with te.autocast(recipe=r):
        m(xg, is_first_microbatch=False).sum().backward()
    assert rel(xg.grad, torch.ones(16, 64) @ w_old) < 0.1


@pytest.mark.parametrize("name", list(RECIPES))
def test_fuse_wgrad_accumulation_into_main_grad(name):
    torch.manual_seed(5)
    r = RECIPES[name](**({"amax_history_len": 4} if name == "delayed" else {}))
    m = te.Linear(128, 64, fuse_wgrad_accumulation=True, device="cpu", params_dtype=torch.bfloat16)
    m.weight.main_grad = torch.full((64, 128), 0.25)
    total = torch.full((64, 128), 0.25)
    for step in range(2):
        x = torch.randn(2, 8, 128, dtype=torch.bfloat16)
        dy = torch.randn(2, 8, 64, dtype=torch.bfloat16)
        fs = bs = None
        if r.delayed():
            fs, bs = (
                m._fwd_state.scale.clone() if step else None,
                m._bwd_state.scale.clone() if step else None,
            )
        _, _, dw, db = run(m, x, dy, r)
        assert dw is None  # the gradient went into main_grad
        total += emulate(r, x, m.weight.detach(), None, dy, fs, bs)[2]
        assert db is not None
    assert m.weight.main_grad.dtype == torch.float32
    assert rel(m.weight.main_grad, total) <= 1e-5
    m.weight.overwrite_main_grad = True
    x, dy = torch.randn(8, 128, dtype=torch.bfloat16), torch.randn(8, 64, dtype=torch.bfloat16)
    fs, bs = (m._fwd_state.scale.clone(), m._bwd_state.scale.clone()) if r.delayed() else (None, None)
    run(m, x, dy, r)
    assert rel(m.weight.main_grad, emulate(r, x, m.weight.detach(), None, dy, fs, bs)[2]) <= 1e-5


def test_fuse_wgrad_accumulation_outside_autocast_goes_to_main_grad():
    torch.manual_seed(6)
    m = te.Linear(32, 16, fuse_wgrad_accumulation=True, device="cpu")
    m.weight.main_grad = torch.full((16, 32), 0.5)
    x = torch.randn(3, 5, 32, requires_grad=True)
    dy = torch.randn(3, 5, 16)
    m(x).backward(dy)
    assert m.weight.grad is None  # the gradient went into main_grad, as inside autocast
    dw = dy.reshape(-1, 16).t() @ x.detach().reshape(-1, 32)
    assert rel(m.weight.main_grad, 0.5 + dw) <= 1e-6
    assert rel(x.grad, dy @ m.weight.detach()) <= 1e-6
    assert rel(m.bias.grad, dy.reshape(-1, 16).sum(0)) <= 1e-6
    m.weight.overwrite_main_grad = True
    m(x).backward(dy)
    assert rel(m.weight.main_grad, dw) <= 1e-6


@pytest.mark.parametrize("name", [None, *RECIPES])
def test_fuse_wgrad_accumulation_without_a_main_grad_is_named(name):
    """A missing main_grad was an AttributeError from inside backward, one of another shape
    torch's broadcasting error or te_gemm's about its output d."""
    m = te.Linear(64, 32, fuse_wgrad_accumulation=True, device="cpu")
    x = torch.randn(32, 64)
    for mg, got in ((None, "got no main_grad"), (torch.zeros(16, 64), r"got main_grad of shape \[16, 64\]")):
        if mg is not None:
            m.weight.main_grad = mg
        with te.autocast(enabled=name is not None, recipe=RECIPES[name]() if name else None):
            y = m(x)
        with pytest.raises(ValueError, match=rf"weight.main_grad: .*the weight's shape \[32, 64\] .*{got}"):
            y.sum().backward()


def test_bad_inputs_say_what_to_do():
    m = te.Linear(64, 32, device="cpu")
    with pytest.raises(ValueError, match=r"in_features=64, got shape \(4, 63\); reshape"):
        m(torch.randn(4, 63))
    with te.autocast(recipe=recipe.Float8CurrentScaling()):
        with pytest.raises(ValueError, match="in_features=64"):
            m(torch.randn(4, 63))
        with pytest.raises(TypeError, match=r"got torch.float64; cast it"):
            m(torch.randn(4, 64, dtype=torch.float64))
    with pytest.raises(ValueError, match="fp8_format"):
        recipe.DelayedScaling(fp8_format=recipe.Format.E5M2)
    with pytest.raises(ValueError, match="fp8_format"):
        recipe.Float8CurrentScaling(fp8_format=recipe.Format.E5M2)
    with pytest.raises(TypeError, match=r"recipe: expected a te.recipe recipe .*got str"):
        te.autocast(recipe="delayed")
    for r, block in ((recipe.MXFP8BlockScaling(), 32), (recipe.NVFP4BlockScaling(), 16)):
        with te.autocast(recipe=r), pytest.raises(ValueError, match=f"multiple of {block}, got 4"):
            m(torch.randn(4, 64))
    with pytest.raises(TypeError, match=r"Linear: fp8_output: expected a bool, got 'yes'"):
        m(torch.randn(4, 64), fp8_output="yes")
    # per-tensor and block FP8: features a multiple of 16 on every device (cuBLASLt's rule)
    for r in (recipe.DelayedScaling(), recipe.Float8CurrentScaling(), recipe.Float8BlockScaling()):
        for k, n, what in ((40, 32, "in_features is 40"), (64, 24, "out_features is 24")):
            odd = te.Linear(k, n, device="cpu")
            with te.autocast(recipe=r), pytest.raises(ValueError, match=f"{what}; build the layer"):
                odd(torch.randn(16, k))
            assert torch.equal(odd(torch.ones(2, k)), odd(torch.ones(2, k)))  # high precision works
    custom = recipe.CustomRecipe(qfactory=lambda role: None)
    with (
        te.autocast(recipe=custom),
        pytest.raises(NotImplementedError, match=r"te.Linear: CustomRecipe is not supported yet"),
    ):
        m(torch.randn(4, 64))
    with pytest.raises(TypeError, match="params_dtype"):
        te.Linear(4, 4, params_dtype=torch.float64, device="cpu")
    with pytest.raises(TypeError, match="unexpected keyword argument 'foo'"):
        te.Linear(4, 4, foo=1, device="cpu")
    # a 0-dim tensor or a non-tensor is named, not an IndexError / AttributeError from inside
    for r in (None, recipe.Float8CurrentScaling()):
        with te.autocast(enabled=r is not None, recipe=r):
            with pytest.raises(ValueError, match=r"in_features=64, got shape \(\); reshape"):
                m(torch.tensor(1.0))
            with pytest.raises(TypeError, match="Linear: inp: expected a torch.Tensor, got list"):
                m([1.0] * 64)
    with pytest.raises(TypeError, match=r"Linear: init_method: expected a callable\(weight\) or None, got 5"):
        te.Linear(4, 4, init_method=5, device="cpu")


@pytest.mark.parametrize(
    "split, match",
    [
        ({"a": -8, "b": 24}, r"size of 'a': expected an int >= 0, got -8"),
        ({"a": 8.5, "b": 7.5}, r"size of 'a': expected an int >= 0, got 8.5"),  # was truncated to 8
        (("q", "q"), r"name 'q': expected distinct names without '\.'"),
        ({"a": 8, "a_": 8}, r"name 'a_': expected distinct names .*got \['a', 'a_'\]"),
        ({"a.b": 8, "c": 8}, r"name 'a.b': expected distinct names without '\.'"),
    ],
)
def test_bad_parameters_split_is_named(split, match):
    for cls in (te.Linear, te.LayerNormLinear):
        with pytest.raises(ValueError, match=f"{cls.__name__}: parameters_split: {match}"):
            cls(16, 16, parameters_split=split, device="cpu")


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("name", ["current", "block"])
def test_compile_fullgraph_matches_eager(name, backend):
    torch._dynamo.reset()
    torch.manual_seed(6)
    r = RECIPES[name]()
    m = te.Linear(128, 96, device="cpu")

    def step(x):
        with te.autocast(recipe=r):
            return m(x)

    cstep = torch.compile(step, fullgraph=True, backend=backend)
    for seed in range(2):
        x = torch.randn(2, 16, 128, generator=torch.Generator().manual_seed(seed))
        xe, xc = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        ye = step(xe)
        ye.sum().backward()
        ge, gbe = m.weight.grad.clone(), m.bias.grad.clone()
        m.weight.grad = m.bias.grad = None
        yc = cstep(xc)
        yc.sum().backward()
        assert torch.equal(yc, ye)
        assert torch.equal(xc.grad, xe.grad)
        assert torch.equal(m.weight.grad, ge) and torch.equal(m.bias.grad, gbe)
        m.weight.grad = m.bias.grad = None


def test_meta_tensors_are_named_in_the_error():
    """A meta module and input reach te-core without storage: the error says so (it named only a
    NULL pointer)."""
    m = te.Linear(32, 32, device="meta")
    x = torch.empty(16, 32, device="meta")
    with te.autocast(recipe=te.recipe.Float8CurrentScaling()):
        with pytest.raises(ValueError, match="meta device"):
            m(x)


@pytest.mark.parametrize("name", ["current", "delayed"])
def test_parametrized_weight_is_read(name):
    # te modules read parameters from _parameters first (_module_base.parameter); a
    # parametrization moves the weight out of it, and the module must use the parametrized value.
    import torch.nn.utils.parametrize as P

    class Double(torch.nn.Module):
        def forward(self, w):
            return 2 * w

    torch.manual_seed(0)
    a = te.Linear(64, 32, device="cpu")
    b = copy.deepcopy(a)
    P.register_parametrization(a, "weight", Double())
    with torch.no_grad():
        b.weight.mul_(2)
    x = torch.randn(8, 64)
    r = RECIPES[name]()
    with te.autocast(recipe=r):
        ya, yb = a(x), b(x)
    assert torch.equal(ya, yb)
    assert torch.equal(a(x), b(x))  # outside autocast too
