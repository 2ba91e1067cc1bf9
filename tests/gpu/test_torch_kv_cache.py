"""te.InferenceParams on CUDA: generation through a two-layer te.TransformerLayer stack with a KV
cache, against the same stack on the CPU (te-core's reference backend, fp32) generating through
the same steps (ragged batches, and a static batch whose uniform steps run without a mask).

The CPU side is itself checked against independent fp64 references in tests/torch/
test_kv_cache.py. Here the cache's copies (index_copy_ into the non-paged rows or the paged
pool, the rows moved when the batch changes) and the masked attention over it run on the GPU in
bf16, outside te.autocast and under current scaling; every new token's output must agree
normwise with the CPU's.
"""

from __future__ import annotations

from collections import OrderedDict

import pytest

torch = pytest.importorskip("torch")
te = pytest.importorskip("te_torch")

H, FFN, HEADS, GROUPS, PROMPTS, NEW = 128, 256, 4, 2, (5, 1, 12), 4
TOL = {"bf16": 3e-2, "current": 8e-2}


def relerr(got, ref) -> float:
    got, ref = got.double().cpu(), ref.double().cpu()
    return ((got - ref).norm() / ref.norm().clamp(min=1e-30)).item()


def stack(device: str):
    return torch.nn.ModuleList(
        te.TransformerLayer(
            H, FFN, HEADS, num_gqa_groups=GROUPS, hidden_dropout=0.0, attention_dropout=0.0, layer_number=i + 1,
            attn_input_format="bshd", params_dtype=torch.float32, device=device,
        )
        for i in range(2)
    ).eval()  # fmt: skip


def generate(layers, params, tokens, recipe, dtype, device):
    """Each sequence's prompt (PROMPTS, then 3 tokens for the sequence joining at the third
    step) and then one token a step; sequence 1 finishes with its prompt and the batch order
    turns each step. Returns each sequence's outputs [tokens, H] fp32."""
    rope = te.RotaryPositionEmbedding(H // HEADS)(64).to(device)
    prompt = dict(enumerate((*PROMPTS, 3)))
    done = {i: 0 for i in prompt}
    outs = {i: [] for i in prompt}
    for step in range(2 * NEW):
        order = [0, 1, 2] + ([3] if step >= 2 else [])
        order = order if step % 2 == 0 else order[::-1]
        step_dict = OrderedDict(
            (i, prompt[i] if done[i] == 0 else 1) for i in order if done[i] < len(tokens[i])
        )
        if not step_dict:
            break
        params.pre_step(step_dict)
        x = torch.zeros(len(step_dict), max(step_dict.values()), H, dtype=dtype, device=device)
        for row, (i, n) in enumerate(step_dict.items()):
            x[row, :n] = tokens[i][done[i] : done[i] + n].to(device, dtype)
        with torch.no_grad(), te.autocast(enabled=recipe is not None, recipe=recipe):
            for layer in layers:
                x = layer(
                    x, self_attn_mask_type="padding_causal", inference_params=params, rotary_pos_emb=rope
                )
        for row, (i, n) in enumerate(step_dict.items()):
            outs[i].append(x[row, :n].float().cpu())
            done[i] += n
    assert all(done[i] == len(tokens[i]) for i in prompt)
    return {i: torch.cat(o) for i, o in outs.items()}


def on_gpu_and_cpu(run, tokens, recipe: str, paged: bool, pages: int):
    """run(layers, params, tokens, recipe, dtype, device) on the GPU in bf16 and on the CPU in
    fp32, the same weights (pages of 4 positions when ``paged``)."""
    cpu_layers = stack("cpu")
    gpu_layers = stack("cuda")
    gpu_layers.load_state_dict(cpu_layers.state_dict())
    gpu_layers.to(torch.bfloat16)
    paging = {"is_paged": True, "total_num_pages": pages, "page_size": 4} if paged else {}
    rec = te.recipe.Float8CurrentScaling() if recipe == "current" else None
    return tuple(
        run(
            layers,
            te.InferenceParams(4, 32, GROUPS, H // HEADS, dtype, device=dev, **paging),
            tokens,
            rec,
            dtype,
            dev,
        )
        for layers, dtype, dev in ((gpu_layers, torch.bfloat16, "cuda"), (cpu_layers, torch.float32, "cpu"))
    )


@pytest.mark.parametrize("recipe", list(TOL))
@pytest.mark.parametrize("paged", [False, True], ids=["nonpaged", "paged"])
def test_generation_matches_cpu(recipe, paged):
    torch.manual_seed(0)
    tokens = [torch.randn(n + NEW, H) for n in (*PROMPTS, 3)]
    tokens[1] = tokens[1][: PROMPTS[1]]
    got, ref = on_gpu_and_cpu(generate, tokens, recipe, paged, pages=12)
    assert got.keys() == ref.keys()
    for i in ref:
        assert got[i].shape == ref[i].shape
        assert relerr(got[i], ref[i]) < TOL[recipe], (i, relerr(got[i], ref[i]))


def generate_static(layers, params, tokens, recipe, dtype, device):
    """A static batch: every sequence's 6-token prompt at once (a causal step over whole new
    sequences), one token a step, one 2-token step (s_q < s_kv: masked), one token again: the
    uniform steps take the maskless path (FlashAttention on the GPU). Returns [b, tokens, H]."""
    b = len(tokens)
    outs, done = [], 0
    for n in (6, 1, 1, 2, 1, 1):
        params.pre_step(OrderedDict((i, n) for i in range(b)))
        x = torch.stack([t[done : done + n] for t in tokens]).to(device, dtype)
        with torch.no_grad(), te.autocast(enabled=recipe is not None, recipe=recipe):
            for layer in layers:
                x = layer(x, self_attn_mask_type="padding_causal", inference_params=params)
        outs.append(x.float().cpu())
        done += n
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("recipe", list(TOL))
@pytest.mark.parametrize("paged", [False, True], ids=["nonpaged", "paged"])
def test_static_batch_generation_matches_cpu(recipe, paged):
    torch.manual_seed(1)
    tokens = [torch.randn(12, H) for _ in range(4)]
    got, ref = on_gpu_and_cpu(generate_static, tokens, recipe, paged, pages=16)
    assert got.shape == ref.shape == (4, 12, H)
    for i in range(4):
        assert relerr(got[i], ref[i]) < TOL[recipe], (i, relerr(got[i], ref[i]))
