"""te's MoE permutation helpers on CUDA against the same calls on the CPU (which
tests/torch/test_moe_permute.py checks against a loop reference), in bf16 at MoE-like and awkward
sizes: mask and index maps, with probs, dropped and padded tokens, permute-and-pad to aligned
expert groups, chunk sort, forward and gradients. Moved rows, probabilities and maps are
bit-exact; sums (unpermute, permute's input gradient) are fp32 sums rounded to bf16 once, in
another order on CUDA (index_add_'s atomics), so they are compared within bf16 tolerance. With
num_out_tokens given nothing synchronizes with the host (torch.cuda.set_sync_debug_mode("error"));
quantized inputs move their bytes on CUDA too."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
te = pytest.importorskip("te_torch")
CUDA = torch.device("cuda")
# tokens, experts, hidden, topK
CASES = {"small": (37, 5, 24, 2), "moe": (4096, 64, 1024, 8), "odd": (1000, 7, 4095, 3)}


def routing(tokens, experts, topk, map_type, seed):
    """Each token to its top-k of random scores; expert experts // 2 gets no token and, with a
    mask map, every 17th token goes nowhere."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(tokens, experts, generator=g)
    scores[:, experts // 2] = -1
    idx = scores.topk(topk, dim=1).indices
    if map_type == "index":
        return idx.to(torch.int32)
    mask = torch.zeros(tokens, experts, dtype=torch.bool).scatter_(1, idx, True)
    mask[::17] = False
    return mask


def step(x, table, probs, merging, num_out, map_type, cots):
    """permute (with probs for a mask map) and unpermute; outputs and gradients."""
    x = x.clone().requires_grad_()
    probs = probs.clone().requires_grad_()
    merging = merging.clone().requires_grad_()
    if map_type == "mask":
        out, pp, row_id_map = te.moe_permute_with_probs(x, probs, table, num_out_tokens=num_out)
    else:
        out, row_id_map = te.moe_permute(x, table, num_out_tokens=num_out, map_type="index")
        pp = None
    y = out * 2 + 1  # an expert
    back = te.moe_unpermute(y, row_id_map, merging, restore_shape=x.shape, map_type=map_type)
    outs, seeds = [out, back], [cots[0][: out.shape[0]], cots[1]]
    if pp is not None:
        outs.append(pp)
        seeds.append(cots[2][: pp.shape[0]])
    ins = [x, merging] + ([probs] if pp is not None else [])
    grads = torch.autograd.grad(outs, ins, seeds)
    return [out, row_id_map, back, *([pp] if pp is not None else [])], list(grads)


@pytest.mark.parametrize("mode", ["all", "drop", "pad"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("map_type", ["mask", "index"])
def test_permute_unpermute_cuda_vs_cpu(map_type, case, mode):
    tokens, experts, hidden, topk = CASES[case]
    table = routing(tokens, experts, topk, map_type, seed=tokens + experts)
    routed = int(table.sum()) if map_type == "mask" else tokens * topk
    num_out = {"all": -1, "drop": routed * 3 // 4, "pad": routed + 5}[mode]
    rows = routed if num_out < 0 else num_out
    g = torch.Generator().manual_seed(1)
    x = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
    slots = table.shape[1]
    probs = torch.rand(tokens, slots, generator=g) * (table != 0 if map_type == "mask" else 1)
    merging = torch.rand(tokens, slots, generator=g)
    cots = [
        torch.randn(rows, hidden, generator=g).to(torch.bfloat16),
        torch.randn(tokens, hidden, generator=g).to(torch.bfloat16),
        torch.randn(rows, generator=g),
    ]
    on_cpu = step(x, table, probs, merging, num_out, map_type, cots)
    on_gpu = step(
        *(v.to(CUDA) for v in (x, table, probs, merging)), num_out, map_type, [c.to(CUDA) for c in cots]
    )
    (out, row_id_map, back, *pp), (dx, dmerging, *dprobs) = on_cpu
    (g_out, g_map, g_back, *g_pp), (g_dx, g_dmerging, *g_dprobs) = on_gpu
    assert torch.equal(g_out.cpu(), out) and torch.equal(g_map.cpu(), row_id_map)
    if pp:
        assert torch.equal(g_pp[0].cpu(), pp[0]) and torch.equal(g_dprobs[0].cpu(), dprobs[0])
    tol = dict(rtol=1.6e-2, atol=1.6e-2)
    torch.testing.assert_close(g_back.cpu().float(), back.float(), **tol)
    torch.testing.assert_close(g_dx.cpu().float(), dx.float(), **tol)
    torch.testing.assert_close(g_dmerging.cpu(), dmerging, rtol=1e-4, atol=1e-3)


def pad_step(x, table, probs, merging, counts, align, cots):
    """permute and pad, an expert, unpermute with pad_offsets; outputs and gradients."""
    x = x.clone().requires_grad_()
    probs = probs.clone().requires_grad_()
    merging = merging.clone().requires_grad_()
    out, pp, row_id_map, pad_offsets, target = te.moe_permute_and_pad_with_probs(
        x, probs, table, counts, align
    )
    y = out * 2 + 1  # an expert: pad rows become nonzero, unpermute must leave them out
    back = te.moe_unpermute(y, row_id_map, merging, restore_shape=x.shape, pad_offsets=pad_offsets)
    grads = torch.autograd.grad(
        [out, pp, back], [x, probs, merging], [cots[0][: out.shape[0]], cots[1][: pp.shape[0]], cots[2]]
    )
    return [out, pp, row_id_map, pad_offsets, target, back], list(grads)


@pytest.mark.parametrize("align", [16, 128])
@pytest.mark.parametrize("case", list(CASES))
def test_permute_and_pad_cuda_vs_cpu(case, align):
    tokens, experts, hidden, topk = CASES[case]
    table = routing(tokens, experts, topk, "mask", seed=tokens + align)
    counts = table.sum(0)  # on the CPU for the CUDA call too: TE moves it to inp's device
    rows = int(sum(-(-c // align) * align for c in counts.tolist()))
    g = torch.Generator().manual_seed(5)
    x = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
    probs = torch.rand(tokens, experts, generator=g) * table
    merging = torch.rand(tokens, experts, generator=g)
    cots = [
        torch.randn(rows, hidden, generator=g).to(torch.bfloat16),
        torch.randn(rows, generator=g),
        torch.randn(tokens, hidden, generator=g).to(torch.bfloat16),
    ]
    on_cpu = pad_step(x, table, probs, merging, counts, align, cots)
    on_gpu = pad_step(
        *(v.to(CUDA) for v in (x, table, probs, merging)), counts, align, [c.to(CUDA) for c in cots]
    )
    (out, pp, row_id_map, pad_offsets, target, back), (dx, dprobs, dmerging) = on_cpu
    (g_out, g_pp, g_map, g_offsets, g_target, g_back), (g_dx, g_dprobs, g_dmerging) = on_gpu
    assert (
        out.shape[0] == rows
        and g_out.device.type == g_offsets.device.type == g_target.device.type == CUDA.type
    )
    for a, b in [(g_out, out), (g_pp, pp), (g_map, row_id_map), (g_offsets, pad_offsets), (g_target, target)]:
        assert torch.equal(a.cpu(), b)
    assert torch.equal(g_dprobs.cpu(), dprobs)
    tol = dict(rtol=1.6e-2, atol=1.6e-2)
    torch.testing.assert_close(g_back.cpu().float(), back.float(), **tol)
    torch.testing.assert_close(g_dx.cpu().float(), dx.float(), **tol)
    torch.testing.assert_close(g_dmerging.cpu(), dmerging, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("case", list(CASES))
def test_sort_chunks_cuda_vs_cpu(case):
    tokens, experts, hidden, _ = CASES[case]
    tp = 2
    g = torch.Generator().manual_seed(2)
    owner = torch.randint(0, experts * tp, (tokens,), generator=g)
    sizes = torch.bincount(owner, minlength=experts * tp)  # zeros among them
    order = torch.arange(experts * tp).view(tp, experts).t().reshape(-1)
    x = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
    probs = torch.rand(tokens, generator=g)
    cot = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
    results = []
    for dev in ("cpu", CUDA):
        xd, pd = x.to(dev).requires_grad_(), probs.to(dev).requires_grad_()
        out, pp = te.moe_sort_chunks_by_index_with_probs(xd, pd, sizes.to(dev), order.to(dev))
        grads = torch.autograd.grad([out, pp], [xd, pd], [cot.to(dev), probs.to(dev)])
        results.append([t.cpu() for t in (out, pp, *grads)])
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


def test_no_host_synchronization_with_num_out_tokens_given():
    tokens, experts, hidden, topk = CASES["moe"]
    mask = routing(tokens, experts, topk, "mask", seed=3).to(CUDA)
    index = routing(tokens, experts, topk, "index", seed=3).to(CUDA)
    x = torch.randn(tokens, hidden, device=CUDA, dtype=torch.bfloat16, requires_grad=True)
    probs = torch.rand(tokens, experts, device=CUDA, requires_grad=True)
    sizes = torch.full((experts,), tokens * topk // experts, device=CUDA)
    sizes[0] += tokens * topk - int(sizes.sum())
    order = torch.randperm(experts, device=CUDA)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out, pp, row_id_map = te.moe_permute_with_probs(x, probs, mask, num_out_tokens=tokens * topk)
        out2, row_id_map2 = te.moe_permute(x, index, map_type="index")  # -1: tokens * topK, known
        out2 = te.moe_sort_chunks_by_index(out2, sizes, order)
        out2 = te.moe_sort_chunks_by_index(out2, sizes.index_select(0, order), torch.argsort(order))
        back = te.moe_unpermute(
            out * pp.unsqueeze(-1).to(out.dtype), row_id_map, probs, restore_shape=x.shape
        )
        back2 = te.moe_unpermute(out2, row_id_map2, probs[:, :topk], map_type="index")
        (back.float().sum() + back2.float().sum()).backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert x.grad is not None and probs.grad is not None


@pytest.mark.parametrize("name", ["current", "mxfp8", "block1d"])
def test_quantized_rows_move_on_cuda(name):
    quantizer = {
        "current": lambda: te.Float8CurrentScalingQuantizer(torch.float8_e4m3fn, CUDA),
        "mxfp8": lambda: te.MXFP8Quantizer(torch.float8_e4m3fn),
        "block1d": lambda: te.Float8BlockQuantizer(torch.float8_e4m3fn, block_scaling_dim=1),
    }[name]()
    tokens, experts, hidden, topk = 256, 8, 512, 2
    mask = routing(tokens, experts, topk, "mask", seed=4).to(CUDA)
    q = quantizer(torch.randn(tokens, hidden, device=CUDA, dtype=torch.bfloat16))
    routed = int(mask.sum())
    out, row_id_map = te.moe_permute(q, mask, num_out_tokens=routed + 3)
    assert type(out) is type(q) and out.device.type == "cuda"
    want, want_map = te.moe_permute(q.dequantize(), mask, num_out_tokens=routed + 3)
    assert torch.equal(out.dequantize(), want) and torch.equal(row_id_map, want_map)
