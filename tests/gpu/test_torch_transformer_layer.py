"""te.TransformerLayer and te.MultiheadAttention on CUDA against the same modules on the CPU.

The CPU side (te-core's reference backend, fp32 activations) is itself checked against an
independent fp64 composition in tests/torch/test_transformer_layer.py and
test_multihead_attention.py. Here the same weights run on the GPU with bf16 activations: outside
te.autocast, and inside it under each FP8 recipe (the CPU side then runs the same recipe with its
emulated quantization, so both sides quantize the same way and differ by the kernels' rounding
and bf16). Outputs and the input's gradient must agree normwise within the bounds below; the
FP8 bounds are wider because one FP8 step of rounding apart moves a value by up to 1/16 (E4M3) or
1/8 (E5M2 gradients).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
te = pytest.importorskip("te_torch")
CUDA = torch.device("cuda")
RECIPES = {
    "bf16": None,
    "delayed": te.recipe.DelayedScaling,
    "current": te.recipe.Float8CurrentScaling,
    "block": te.recipe.Float8BlockScaling,
}
# (output, input gradient) normwise bounds
TOL = {"bf16": (2e-2, 3e-2), "delayed": (6e-2, 1.5e-1), "current": (6e-2, 1.5e-1), "block": (6e-2, 1.5e-1)}


def relerr(got, ref) -> float:
    got, ref = got.double().cpu(), ref.double().cpu()
    return ((got - ref).norm() / ref.norm().clamp(min=1e-30)).item()


def run(module, x, dy, recipe, steps=2, **fwd):
    """``steps`` forward+backward steps (the second on DelayedScaling's updated scales); the last
    step's output and input gradient."""
    for _ in range(steps):
        x = x.detach().requires_grad_()
        if recipe is None:
            y = module(x, **fwd)
        else:
            with te.autocast(recipe=recipe()):
                y = module(x, **fwd)
        y.backward(dy)
    return y.detach().float().cpu(), x.grad.float().cpu()


def pair(make):
    """The module on the CPU (fp32) and a copy on CUDA with bf16 parameters."""
    torch.manual_seed(0)
    cpu = make("cpu")
    gpu = make("cuda")
    gpu.load_state_dict(cpu.state_dict())
    return cpu, gpu.to(torch.bfloat16)


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("layer_type", ["encoder", "decoder"])
def test_transformer_layer(recipe, layer_type):
    s, b, h, f, heads = 64, 2, 256, 512, 4

    def make(dev):
        return te.TransformerLayer(
            h, f, heads, num_gqa_groups=2, hidden_dropout=0.0, attention_dropout=0.0, layer_type=layer_type,
            device=dev,
        )  # fmt: skip

    cpu, gpu = pair(make)
    torch.manual_seed(1)
    x = torch.randn(s, b, h).bfloat16().float()
    dy = torch.randn(s, b, h).bfloat16().float()
    fwd = {}
    if layer_type == "decoder":
        fwd_cpu = {"encoder_output": torch.randn(48, b, h).bfloat16().float()}
        fwd = {"encoder_output": fwd_cpu["encoder_output"].to(CUDA, torch.bfloat16)}
    else:
        fwd_cpu = {}
    rope = te.RotaryPositionEmbedding(h // heads, device="cpu")(s)
    y_ref, dx_ref = run(cpu, x, dy, RECIPES[recipe], rotary_pos_emb=rope, **fwd_cpu)
    y, dx = run(gpu, x.to(CUDA, torch.bfloat16), dy.to(CUDA, torch.bfloat16), RECIPES[recipe],
                rotary_pos_emb=rope.to(CUDA), **fwd)  # fmt: skip
    out_tol, grad_tol = TOL[recipe]
    assert relerr(y, y_ref) < out_tol
    assert relerr(dx, dx_ref) < grad_tol


@pytest.mark.parametrize("recipe", ["bf16", "delayed"])
def test_multihead_attention_thd_with_rope(recipe):
    """Packed sequences through the whole block: QKV, per-sequence rotary positions, the thd
    attention core, the projection."""
    h, heads = 128, 4
    lens = [37, 64, 27]  # 128 tokens (a multiple of 16 for the FP8 GEMMs)
    cu = torch.tensor([0, 37, 101, 128], dtype=torch.int32)

    def make(dev):
        return te.MultiheadAttention(
            h, heads, attention_dropout=0.0, input_layernorm=True, qkv_format="thd",
            attn_mask_type="padding_causal", fuse_qkv_params=True, device=dev,
        )  # fmt: skip

    cpu, gpu = pair(make)
    torch.manual_seed(2)
    x = torch.randn(sum(lens), h).bfloat16().float()
    dy = torch.randn(sum(lens), h).bfloat16().float()
    rope = te.RotaryPositionEmbedding(h // heads, device="cpu")(max(lens))
    y_ref, dx_ref = run(cpu, x, dy, RECIPES[recipe], rotary_pos_emb=rope, cu_seqlens_q=cu, cu_seqlens_kv=cu)
    y, dx = run(gpu, x.to(CUDA, torch.bfloat16), dy.to(CUDA, torch.bfloat16), RECIPES[recipe],
                rotary_pos_emb=rope.to(CUDA), cu_seqlens_q=cu.to(CUDA), cu_seqlens_kv=cu.to(CUDA),
                max_seqlen_q=max(lens), max_seqlen_kv=max(lens))  # fmt: skip
    out_tol, grad_tol = TOL[recipe]
    assert relerr(y, y_ref) < out_tol
    assert relerr(dx, dx_ref) < grad_tol
