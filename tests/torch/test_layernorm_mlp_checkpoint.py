"""te.LayerNormMLP(checkpoint=True), TE's selective recompute (te_torch._layernorm_mlp_recompute):
against the same layer with checkpoint=False, the reference, bit for bit: outputs, input and
parameter gradients (main_grad too) and the delayed-scaling state, step after step, in high
precision and under every recipe, for plain and gated activations, both norms, with and without
biases, odd token counts, is_first_microbatch sequences, frozen parts, retained graphs and
te.checkpoint around it. Then what it is for: FC1's and the activation's outputs [tokens, ffn]
are no longer among the tensors kept for backward. Under torch.no_grad() nothing changes;
what te cannot do raises, naming the argument."""

import math

import pytest
import te_torch as te
import torch
from _module_ref import delayed_states
from te_torch import _layernorm_mlp_recompute, recipe
from te_torch._quantized_tensor import QuantizedTensor

H, FFN = 64, 128
RECIPES = {
    "high_precision": None,
    "delayed": lambda: recipe.DelayedScaling(amax_history_len=4),
    "current": recipe.Float8CurrentScaling,
    "block": recipe.Float8BlockScaling,
    "mxfp8": recipe.MXFP8BlockScaling,
    "nvfp4": recipe.NVFP4BlockScaling,
}
PER_TENSOR_AND_BLOCK = ["high_precision", "delayed", "current", "block"]


def pair(dtype=torch.float32, **kw):
    """(checkpoint=False, checkpoint=True) layers with the same non-trivial parameters."""
    torch.manual_seed(0)
    plain = te.LayerNormMLP(H, FFN, params_dtype=dtype, device="cpu", **kw)
    with torch.no_grad():
        for name, p in plain.named_parameters():
            if name == "layer_norm_weight":
                p.normal_(0.0 if plain.zero_centered_gamma else 1.0, 0.3)
            elif "bias" in name:
                p.normal_(0.0, 0.3)
            else:
                p.normal_(0.0, 0.15)
    ckpt = te.LayerNormMLP(H, FFN, params_dtype=dtype, device="cpu", checkpoint=True, **kw)
    ckpt.load_state_dict(plain.state_dict())
    return plain, ckpt


def step(m, x, dy, r, seed, **fwd):
    """Forward and backward of ``m`` (under ``r``, if any) with torch's generator at ``seed``
    before each (NVFP4 draws its stochastic-rounding seeds from it); what both report."""
    x = x.detach().clone().requires_grad_(x.requires_grad)
    torch.manual_seed(seed)
    with te.autocast(enabled=r is not None, recipe=r):
        res = m(x, **fwd)
    ys = res if isinstance(res, tuple) else (res,)
    torch.manual_seed(seed + 1)
    torch.autograd.backward([y for y in ys], [dy] + [torch.ones_like(y) for y in ys[1:]])
    got = [y.detach() for y in ys] + [x.grad]
    for p in m.parameters():
        got.append(p.main_grad.clone() if hasattr(p, "main_grad") else p.grad)
    return got


def assert_same(got, want, what=""):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if w is None:
            assert g is None, (what, i)
        else:
            assert g.dtype == w.dtype and torch.equal(g, w), (what, i, (g.float() - w.float()).abs().max())


def compare(plain, ckpt, rname, shape=(3, 32, H), steps=3, dtype=torch.float32, x_grad=True, **fwd):
    """``steps`` training steps of both layers on the same data, compared after each."""
    r = RECIPES[rname]() if RECIPES[rname] else None
    for i in range(steps):  # delayed scaling: later steps quantize with the scales step 0 made
        g = torch.Generator().manual_seed(i)
        x = (torch.randn(shape, generator=g) * 2 + 0.5).to(dtype).requires_grad_(x_grad)
        dy = torch.randn(shape, generator=g).to(dtype)
        want = step(plain, x, dy, r, 10 * i, **fwd)
        got = step(ckpt, x, dy, r, 10 * i, **fwd)
        assert_same(got, want, f"step {i}")
        plain.zero_grad(set_to_none=True)
        ckpt.zero_grad(set_to_none=True)
        assert_same(delayed_states(ckpt), delayed_states(plain), f"state after step {i}")


# -- bit for bit against checkpoint=False ------------------------------------------------------


@pytest.mark.parametrize("norm", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("act", ["gelu", "swiglu", "srelu", "geglu"])
@pytest.mark.parametrize("rname", list(RECIPES))
def test_same_bits_as_without_checkpoint(rname, act, norm):
    plain, ckpt = pair(activation=act, normalization=norm)
    compare(plain, ckpt, rname)
    if rname == "delayed":  # the scales moved between steps: the recompute used the forward's
        assert not torch.equal(ckpt._fc2.fwd.scale, torch.ones(3))


@pytest.mark.parametrize("rname", list(RECIPES))
@pytest.mark.parametrize(
    "kw",
    [
        {"bias": False},
        {"return_layernorm_output": True},
        {"return_bias": True, "zero_centered_gamma": True, "activation": "reglu"},
        {"return_layernorm_output": True, "return_bias": True, "activation": "qgeglu"},
        {"activation": "clamped_swiglu", "activation_params": {"limit": 0.75, "alpha": 1.5}},
    ],
    ids=["no_bias", "ln_output", "return_bias_zcg", "both_outputs", "clamped_swiglu"],
)
def test_outputs_and_options(rname, kw):
    plain, ckpt = pair(**kw)
    compare(plain, ckpt, rname, steps=2)


@pytest.mark.parametrize("rname", PER_TENSOR_AND_BLOCK)
@pytest.mark.parametrize(
    "shape", [(3, 7, H), (37, H), (1, 16, H)], ids=["21_tokens", "37_tokens", "16_tokens"]
)
def test_bf16_and_token_counts_that_pad(rname, shape):
    plain, ckpt = pair(dtype=torch.bfloat16, activation="swiglu")
    compare(plain, ckpt, rname, shape=shape, dtype=torch.bfloat16, steps=2)


@pytest.mark.parametrize("rname", list(RECIPES))
def test_fuse_wgrad_accumulation(rname):
    plain, ckpt = pair(fuse_wgrad_accumulation=True, activation="geglu")
    for m in (plain, ckpt):
        for w in (m.fc1_weight, m.fc2_weight):
            w.main_grad = torch.zeros_like(w, dtype=torch.float32)  # accumulated over the steps
    compare(plain, ckpt, rname, steps=2)


@pytest.mark.parametrize("rname", ["high_precision", "delayed", "current", "mxfp8"])
def test_is_first_microbatch_sequences(rname):
    """Microbatches of a step share the cached quantized weights; gradients accumulate."""
    plain, ckpt = pair(activation="swiglu")
    r = RECIPES[rname]() if RECIPES[rname] else None
    for i, first in enumerate([True, False, False, True, False, None]):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(2, 32, H, generator=g).requires_grad_(True)
        dy = torch.randn(2, 32, H, generator=g)
        want = step(plain, x, dy, r, i, is_first_microbatch=first)
        got = step(ckpt, x, dy, r, i, is_first_microbatch=first)
        assert_same(got, want, f"microbatch {i}")  # the parameters' grads: accumulated so far
        assert_same(delayed_states(ckpt), delayed_states(plain), f"state after microbatch {i}")


FROZEN = {
    "input_only": (True, ()),
    "no_input_grad": (False, ()),
    "fc2_only": (False, ("layer_norm_weight", "layer_norm_bias", "fc1_weight", "fc1_bias")),
    "fc1_bias_and_fc2": (False, ("layer_norm_weight", "layer_norm_bias", "fc1_weight")),
    "fc2_weight_frozen": (True, ("fc2_weight",)),
    "norm_only": (False, ("fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias")),
}


@pytest.mark.parametrize("rname", PER_TENSOR_AND_BLOCK + ["nvfp4"])
@pytest.mark.parametrize("kind", list(FROZEN))
def test_frozen_parts(rname, kind):
    """What backward recomputes follows what needs a gradient: h for the activation's backward,
    FC2's input for its weight gradient, neither when only FC2's bias or the norm needs one."""
    x_grad, frozen = FROZEN[kind]
    plain, ckpt = pair(activation="gelu")
    for m in (plain, ckpt):
        for name in frozen:
            getattr(m, name).requires_grad_(False)
    compare(plain, ckpt, rname, steps=2, x_grad=x_grad)


@pytest.mark.parametrize("rname", ["high_precision", "delayed", "block"])
def test_retained_graph_runs_backward_twice(rname):
    """A retained graph recomputes again on its second backward, the gradients adding up."""
    plain, ckpt = pair(activation="swiglu")
    r = RECIPES[rname]() if RECIPES[rname] else None
    x = torch.randn(2, 32, H)
    dy = torch.randn(2, 32, H)
    results = []
    for m in (plain, ckpt):
        xx = x.clone().requires_grad_(True)
        with te.autocast(enabled=r is not None, recipe=r):
            y = m(xx)
        y.backward(dy, retain_graph=True)
        y.backward(2 * dy)
        results.append([y.detach(), xx.grad, *[p.grad for p in m.parameters()], *delayed_states(m)])
    assert_same(results[1], results[0])


@pytest.mark.parametrize("rname", ["high_precision", "delayed", "current"])
@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non_reentrant"])
def test_inside_te_checkpoint(rname, reentrant):
    """te.checkpoint around the layer: the outer recompute and the layer's own agree with the
    plain layer under te.checkpoint."""
    plain, ckpt = pair(activation="geglu")
    r = RECIPES[rname]() if RECIPES[rname] else None
    for i in range(2):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(32, H, generator=g)
        results = []
        for m in (plain, ckpt):
            xx = x.clone().requires_grad_(True)
            with te.autocast(enabled=r is not None, recipe=r):
                y = te.checkpoint(m, xx, use_reentrant=reentrant)
            (y * y).sum().backward()
            results.append([y.detach(), xx.grad, *[p.grad for p in m.parameters()], *delayed_states(m)])
            m.zero_grad(set_to_none=True)
        assert_same(results[1], results[0], f"step {i}")


def test_calibration_records_the_same_amaxes():
    plain, ckpt = pair(activation="srelu")
    x = torch.randn(32, H)
    r = recipe.DelayedScaling(amax_history_len=2)
    for m in (plain, ckpt):
        with te.autocast(enabled=False, calibrating=True, recipe=r):
            m(x.clone().requires_grad_(True)).sum().backward()
    assert_same(delayed_states(ckpt), delayed_states(plain))


# -- what is kept for backward -----------------------------------------------------------------


def _bytes(t: torch.Tensor) -> int:
    if isinstance(t, QuantizedTensor):  # the inner data and scales
        names, _ = t.__tensor_flatten__()
        return sum(_bytes(getattr(t, n)) for n in names)
    return t.numel() * t.element_size()


def kept_for_backward(m, x, r, params):
    """(bytes, shapes) of what the forward keeps for backward besides the parameters: tensors
    saved through autograd (seen by saved_tensors_hooks) and a fused step's saved buffer."""
    seen, shapes = {}, []
    param_ptrs = {p.untyped_storage().data_ptr() for p in params}

    def pack(t):
        if isinstance(t, QuantizedTensor):
            key = id(t)
        elif t.untyped_storage().data_ptr() in param_ptrs:
            return t
        else:
            key = (t.untyped_storage().data_ptr(), tuple(t.shape), t.dtype)
        if key not in seen:
            seen[key] = _bytes(t)
            shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with te.autocast(enabled=r is not None, recipe=r):
            y = m(x.clone().requires_grad_(True))
    buf = getattr(y.grad_fn, "saved_buf", None)  # _layernorm_mlp_step's packed buffer
    extra = 0 if buf is None else buf.numel()
    if buf is not None:
        shapes.append(("saved_buf", buf.numel()))
    return sum(seen.values()) + extra, shapes, y


@pytest.mark.parametrize("act", ["gelu", "swiglu"])
@pytest.mark.parametrize("rname", list(RECIPES))
def test_fc1_and_activation_outputs_are_not_kept(rname, act):
    """checkpoint=True keeps no [tokens, ffn] (or [tokens, 2 ffn]) tensor, and keeps less by at
    least the FC1 output h (x's dtype) that checkpoint=False keeps, minus what the recompute and
    the op-by-op path keep instead: the row-wise copies of the quantized FC1 input and of the
    weights (at most 1 byte an element, with 1/32 for block scales)."""
    tokens = 96
    plain, ckpt = pair(activation=act)
    r = RECIPES[rname]() if RECIPES[rname] else None
    x = torch.randn(3, 32, H)

    def activation_shaped(shapes):  # h [tokens, (2 *) ffn], a [tokens, ffn] (or transposed)
        return [
            s for s in shapes if isinstance(s[0], int) and math.prod(s) in (tokens * FFN, tokens * 2 * FFN)
        ]

    n_plain, shapes_plain, _ = kept_for_backward(plain, x, r, list(plain.parameters()))
    n_ckpt, shapes_ckpt, y = kept_for_backward(ckpt, x, r, list(ckpt.parameters()))
    assert activation_shaped(shapes_ckpt) == [], shapes_ckpt
    h_bytes = tokens * (2 * FFN if act == "swiglu" else FFN) * 4  # fp32 here
    rows = 0 if r is None else (tokens * H + ckpt.fc1_weight.numel() + ckpt.fc2_weight.numel()) * 33 // 32
    assert n_ckpt <= n_plain - h_bytes + rows, (n_ckpt, n_plain, shapes_ckpt, shapes_plain)
    if "saved_buf" not in str(shapes_plain):  # op by op: h and a among the saved tensors
        assert activation_shaped(shapes_plain), shapes_plain
    y.sum().backward()  # and the graph still runs


# -- no_grad, which path runs, errors ----------------------------------------------------------


@pytest.mark.parametrize("rname", list(RECIPES))
def test_no_grad_runs_as_without_checkpoint(rname, monkeypatch):
    plain, ckpt = pair(activation="swiglu")
    r = RECIPES[rname]() if RECIPES[rname] else None
    calls = []

    def counted(name, f):
        def call(*a, **k):
            calls.append(name)
            return f(*a, **k)

        return call

    fn = _layernorm_mlp_recompute.LayerNormMLPRecomputeFn
    monkeypatch.setattr(fn, "apply", counted("fp8", fn.apply))
    import te_torch._layernorm_mlp as module

    monkeypatch.setattr(module, "recomputed_mlp", counted("hp", module.recomputed_mlp))
    x = torch.randn(2, 32, H)
    with torch.no_grad(), te.autocast(enabled=r is not None, recipe=r):
        got, want = ckpt(x), plain(x)
    assert torch.equal(got, want) and calls == []
    assert_same(delayed_states(ckpt), delayed_states(plain))
    with te.autocast(enabled=r is not None, recipe=r):
        ckpt(x.requires_grad_(True))
    assert calls == ["hp" if r is None else "fp8"]


def test_errors_name_the_argument():
    with pytest.raises(TypeError, match=r"LayerNormMLP: checkpoint: expected a bool, got str"):
        te.LayerNormMLP(H, FFN, checkpoint="selective", device="cpu")
    with pytest.raises(
        NotImplementedError,
        match=r"LayerNormMLP: checkpoint=True with tensor parallelism \(set_parallel_mode=True, "
        r"tp_size=2\) is not implemented in te yet",
    ):
        te.LayerNormMLP(H, FFN, set_parallel_mode=True, tp_size=2, checkpoint=True, device="cpu")
    # one rank: nothing is split, so the flag applies
    assert te.LayerNormMLP(
        H, FFN, set_parallel_mode=True, tp_size=1, checkpoint=True, device="cpu"
    ).checkpoint


# under a recipe the recompute reads the forward's quantized FC1 input and weight, and fc1_bias
IN_PLACE = [("high_precision", w) for w in ("fc1_bias", "fc1_weight", "ln_out")] + [
    ("current", "fc1_bias"),
    ("current", "ln_out"),
]


@pytest.mark.parametrize("rname, what", IN_PLACE)
def test_recompute_inputs_changed_in_place_raise(rname, what):
    """What the recompute reads, changed in place between forward and backward: an error (the
    recompute would silently use the new values), as autograd's for a saved tensor."""
    m = te.LayerNormMLP(H, FFN, return_layernorm_output=True, checkpoint=True, device="cpu")
    r = RECIPES[rname]() if RECIPES[rname] else None
    with te.autocast(enabled=r is not None, recipe=r):
        y, ln_out = m(torch.randn(32, H, requires_grad=True))
    with torch.no_grad():
        (ln_out if what == "ln_out" else getattr(m, what)).add_(1.0)
    if rname != "high_precision" and what == "ln_out":  # the quantized copy was saved, not ln_out
        y.sum().backward()
        return
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_compile_matches_eager():
    """torch.compile: quantized (current scaling) in full graph, the recompute traced into the
    backward; high precision with a graph break (the recompute's hooks run eagerly)."""
    torch._dynamo.reset()
    plain, ckpt = pair(activation="swiglu")
    x, dy = torch.randn(2, 16, H), torch.randn(2, 16, H)
    for r, fullgraph in ((recipe.Float8CurrentScaling(), True), (None, False)):
        want = step(plain, x.requires_grad_(True), dy, r, 0)
        plain.zero_grad(set_to_none=True)

        def fwd(t, r=r):
            with te.autocast(enabled=r is not None, recipe=r):
                return ckpt(t)

        if r is not None:
            fwd_eager = fwd
            fwd_eager(x)  # a GEMM module's first call under a recipe runs eagerly
        cfwd = torch.compile(fwd, fullgraph=fullgraph, backend="aot_eager")
        xc = x.detach().clone().requires_grad_(True)
        yc = cfwd(xc)
        yc.backward(dy)
        got = [yc.detach(), xc.grad, *[p.grad for p in ckpt.parameters()]]
        ckpt.zero_grad(set_to_none=True)
        assert_same(got, want, "fullgraph" if fullgraph else "graph break")


def test_compiled_forward_keeps_no_ffn_tensor():
    """Under torch.compile (current scaling, full graph) the forward graph hands backward no
    [tokens, ffn] tensor with checkpoint=True (the recompute is not merged back into the forward),
    and does with checkpoint=False (so the check can fail)."""
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified

    r = recipe.Float8CurrentScaling()
    kept = {}
    for flag, m in zip((False, True), pair(activation="swiglu"), strict=True):
        torch._dynamo.reset()
        x = torch.randn(2, 48, H, requires_grad=True)
        with te.autocast(recipe=r):
            m(x)  # a GEMM module's first call under a recipe runs eagerly
        shapes = kept.setdefault(flag, [])

        def fw(gm, _, shapes=shapes):
            (outs,) = [n.args[0] for n in gm.graph.nodes if n.op == "output"]
            shapes.extend(tuple(o.meta["val"].shape) for o in outs if "val" in getattr(o, "meta", {}))
            return make_boxed_func(gm.forward)

        def backend(gm, example, fw=fw):
            return aot_module_simplified(
                gm, example, fw_compiler=fw, bw_compiler=lambda g, _: make_boxed_func(g.forward)
            )

        def run(t, m=m):
            with te.autocast(recipe=r):
                return m(t)

        torch.compile(run, backend=backend, fullgraph=True)(x).sum().backward()
    tokens = 96

    def ffn_shaped(shapes):  # h [tokens, 2 ffn], a (or its transposed copy) [tokens, ffn]
        return [s for s in shapes if math.prod(s) in (tokens * FFN, tokens * 2 * FFN)]

    assert kept[True] and not ffn_shaped(kept[True]), kept[True]
    assert ffn_shaped(kept[False]), kept[False]
