"""One rank of tests/torch/test_fsdp2.py (and tests/gpu/test_torch_fsdp2.py): ``run`` starts the
ranks as processes of this file; each prints its findings as one JSON line.

    python _fsdp2_rank.py RANK WORLD RENDEZVOUS_FILE RECIPE CASE DEVICE

RECIPE: current, delayed, block (Float8BlockScaling: 128x128-tile weights whose rows split into
whole tiles), block1d (its 1x128-block weights, rows that split into whole 128-row blocks), mxfp8
(MXFP8BlockScaling: rows that split into whole 32-row blocks) or nvfp4 (NVFP4BlockScaling:
16x16-tile weights, rows that split into whole 16-row blocks).
CASE: train (FSDP2 against one process, both training with fp32 master weights), mixed_scales
(ranks with different weights: the first all-gather must fail), dcp (a save and load through
torch.distributed.checkpoint), mixed_precision (MixedPrecisionPolicy with bf16 params),
split_high (block-scaled weights FSDP2 must shard in high precision, against one process with
FP8 weights), high_precision (weights not quantized, DelayedScaling with the amax reduced over
the ranks). DEVICE: cpu (gloo) or cuda (NCCL, one GPU a rank).
"""

import sys

import torch
import torch.distributed as dist
from _ranks import finish, init_rank, run_ranks
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

# each recipe's shard type, and what goes over the wire for each FP8 weight: its bytes, and a
# tile-scaled shard's scale rows
SHARD = {
    "current": "Float8Tensor",
    "delayed": "Float8Tensor",
    "block": "Float8BlockwiseQTensor",
    "block1d": "Float8BlockwiseQTensor",
    "mxfp8": "MXFP8Tensor",
    "nvfp4": "NVFP4Tensor",
}
WIRE = {
    "current": ["torch.uint8"],
    "delayed": ["torch.uint8"],
    "block": ["torch.uint8", "torch.float32"],
    "block1d": ["torch.uint8", "torch.float32"] * 2,  # both copies: the column-wise one is no transpose
    "mxfp8": ["torch.uint8"] * 4,  # both copies (the column-wise one is no transpose) and scales
    "nvfp4": ["torch.uint8"] * 4,  # the same (E2M1 pairs, E4M3 scales)
}


def run(tmp_path, world: int, recipe: str, case: str, device: str = "cpu") -> list[dict]:
    """Runs the ranks of ``case`` and returns each rank's findings (asserting that all exit 0)."""
    return run_ranks(__file__, tmp_path, world, recipe, case, device)


def _local(t):
    return t.to_local() if isinstance(t, DTensor) else t


# each RECIPE's recipe (the weights' and autocast's), and its model's widths (LayerNormLinear
# out, Linear out, LayerNormMLP ffn): block's rows are multiples of 256 (two shards of whole
# 128x128 tiles; block1d's of whole 128-row blocks), block_cut's 128 (two shards of half a tile),
# mxfp8's multiples of 64 (two of whole 32-row blocks), nvfp4's of 32 (two of whole 16-row blocks)
_MODELS = {
    "current": ("Float8CurrentScaling", {}, (32, 48, 96)),
    "delayed": ("DelayedScaling", {}, (32, 48, 96)),
    "block": ("Float8BlockScaling", {}, (256, 512, 128)),
    "block1d": ("Float8BlockScaling", {"w_block_scaling_dim": 1}, (256, 512, 128)),
    "block_cut": ("Float8BlockScaling", {}, (128, 128, 64)),
    "mxfp8": ("MXFP8BlockScaling", {}, (64, 128, 64)),
    "nvfp4": ("NVFP4BlockScaling", {}, (32, 64, 32)),
}


def _recipe(te, name: str):
    recipe, kwargs, _ = _MODELS[name]
    return getattr(te.recipe, recipe)(**kwargs)


def _build(te, seed: int, dev: str, recipe_name: str = "current"):
    torch.manual_seed(seed)
    a, b, ffn = _MODELS[recipe_name][2]
    with te.quantized_model_init(recipe=_recipe(te, recipe_name)):
        return torch.nn.Sequential(
            te.LayerNormLinear(64, a, device=dev),
            te.Linear(a, b, device=dev),
            te.LayerNormMLP(b, ffn, activation="swiglu", device=dev),
        )


def _rowwise(t):
    """(row-wise bytes, their scale, whether the column-wise copy is absent) of an FP8 / FP4
    weight; a tile scale table without its padding columns, which no kernel writes."""
    if hasattr(t, "_data"):  # Float8Tensor
        return t._data, t._scale_inv, t._transpose is None
    if getattr(t, "_is_2D_scaled", False):  # 128x128 tiles: a row of scales per 128 rows
        scale = t._rowwise_scale_inv[:, : -(-t.shape[-1] // 128)]
    elif hasattr(t, "_is_2D_scaled"):  # 1x128 blocks: a column of scales per row
        scale = t._rowwise_scale_inv[:, : t.shape[0]].t()
    else:  # MXFP8 / NVFP4: a row of scales per row, one per 32 / 16 elements
        scale = t._rowwise_scale_inv[: t.shape[0], : -(-t.shape[-1] // t._block_size)]
    return t._rowwise_data, scale, t._columnwise_data is None


def _rank_part(te, r, rank: int, world: int):
    """This rank's part of the unsharded weight ``r``: (its rows' bytes, their scale)."""
    data, scale, _ = _rowwise(r)
    if not isinstance(r, te.Float8Tensor):  # each shard its own rows' block scales
        scale = torch.chunk(scale, world, dim=0)[rank]
    return torch.chunk(data.view(torch.uint8), world, dim=0)[rank], scale


def _same_scales(te, s, r, rank: int, world: int) -> bool:
    """Whether the shard ``s`` holds its rows' scales of the unsharded weight ``r`` (and, NVFP4,
    its global amaxes)."""
    same = torch.equal(_rowwise(s)[1], _rank_part(te, r, rank, world)[1])
    return same and (not isinstance(r, te.NVFP4Tensor) or torch.equal(s._amax, r._amax))


def _trainer(te, model, recipe):
    """docs/linear.rst's master-weights loop, written for sharded and unsharded parameters alike:
    (the FP8 parameters, step(x) -> (y, their gradients))."""
    qparams = [p for p in model.parameters() if isinstance(_local(p), te.QuantizedTensor)]
    masters = [_local(p).dequantize().float().requires_grad_() for p in qparams]
    ids = {id(p) for p in qparams}
    others = [p for p in model.parameters() if id(p) not in ids]
    # one group each: a group mixing the plain local masters with FSDP's DTensor parameters
    # fails in the foreach kernels torch's optimizers use on CUDA (forced here on the CPU too)
    opt = torch.optim.AdamW([{"params": masters}, {"params": others}], lr=1e-2, foreach=True)

    def step(x):
        with te.autocast(recipe=recipe):
            y = model(x)
        y.float().pow(2).mean().backward()
        grads = [_local(p.grad).clone() for p in qparams]
        with torch.no_grad():
            for p, m in zip(qparams, masters, strict=True):
                m.grad, p.grad = _local(p.grad).float(), None
            opt.step()
            opt.zero_grad()
            for p, m in zip(qparams, masters, strict=True):
                _local(p).quantize_(m)
        return y.detach(), grads

    return qparams, step


def _mixed_scales(te, recipe, recipe_name, mesh, rank: int, dev: str) -> dict:
    model = _build(te, rank, dev, recipe_name)  # every rank its own weights: the shards' scales differ
    for m in model:
        fully_shard(m, mesh=mesh)
    try:
        with te.autocast(recipe=recipe):
            model(torch.randn(32, 64, device=dev))
    except RuntimeError as e:
        return {"error": str(e)}
    return {"error": None}


def _dcp(te, recipe, recipe_name, mesh, path: str, dev: str) -> dict:
    """A step of model a, a DCP save, and a load into model b built fresh from other weights (no
    scaling state yet): b then holds a's weights and DelayedScaling state, and computes a's
    outputs."""
    import torch.distributed.checkpoint as dcp
    from _module_ref import delayed_states

    a, b = _build(te, 0, dev, recipe_name), _build(te, 1, dev, recipe_name)
    for m in (*a, *b):
        fully_shard(m, mesh=mesh)
    x = torch.randn(32, 64, device=dev)  # MXFP8: whole 32-row blocks
    with te.autocast(recipe=recipe):
        a(x)
    dcp.save(a.state_dict(), checkpoint_id=path + ".ckpt")
    sd = b.state_dict()
    dcp.load(sd, checkpoint_id=path + ".ckpt")
    b.load_state_dict(sd)
    saved = delayed_states(a)
    states = [torch.equal(p, q) for p, q in zip(saved, delayed_states(b), strict=True)]
    with te.autocast(recipe=recipe):
        equal = torch.equal(b(x), a(x))
    shard = type(_local(b[0].weight)).__name__
    return {"equal": equal, "shard": shard, "states": len(saved), "states_equal": all(states)}


def _train(te, recipe, recipe_name, mesh, rank: int, world: int, dev: str) -> dict:
    ref, model = _build(te, 0, dev, recipe_name), _build(te, 0, dev, recipe_name)
    for m in model:
        fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    ref_q, ref_step = _trainer(te, ref, recipe)
    q, step = _trainer(te, model, recipe)
    shards = []
    for p, r in zip(q, ref_q, strict=True):
        s = _local(p)
        data, scale, rowwise_only = _rowwise(s)
        rows = _rank_part(te, r, rank, world)[0]
        same_rows = torch.equal(data.view(torch.uint8)[: rows.shape[0]], rows)
        same = _same_scales(te, s, r, rank, world)
        shards.append([type(s).__name__, data.element_size(), rowwise_only, same_rows, same])
    torch.manual_seed(7)
    steps = []
    for i in range(3):
        x = torch.randn(32, 64, device=dev)  # the same batch on every rank: FSDP's mean of grads is exact
        torch.manual_seed(100 + i)  # both runs draw the same stochastic-rounding seeds (NVFP4's gradients)
        y, grads = step(x)
        torch.manual_seed(100 + i)
        y_ref, grads_ref = ref_step(x)
        g_err = 0.0
        for g, gr in zip(grads, grads_ref, strict=True):
            piece = torch.chunk(gr, world, dim=0)[rank]
            g_err = max(g_err, (g - piece).abs().max().item() / max(piece.abs().max().item(), 1e-30))
        scales = all(_same_scales(te, _local(p), r, rank, world) for p, r in zip(q, ref_q, strict=True))
        steps.append(
            {
                "y_equal": torch.equal(y, y_ref),
                "y_err": (y - y_ref).abs().max().item(),
                "g_err": g_err,
                "scales_equal": scales,
            }
        )
    # what went over the wire for each FP8 weight (FSDP's all-gather buffers, a private field)
    wire = []
    for m in model:
        for fp in m._get_fsdp_state()._fsdp_param_group.fsdp_params:
            if isinstance(_local(fp.sharded_param), te.QuantizedTensor):
                wire.append([str(t.dtype) for t in fp.all_gather_outputs])
    return {"shards": shards, "steps": steps, "wire": wire}


def _split_high(te, recipe, mesh, dev: str) -> dict:
    """Weights whose shards would cut a tile (block_cut): FSDP2 shards them in high precision,
    each step quantizes them as the recipe says, and the model trains as one process with FP8
    weights and fp32 masters does."""
    ref, model = _build(te, 0, dev, "block_cut"), _build(te, 0, dev, "block_cut")
    for m in model:
        fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    _, ref_step = _trainer(te, ref, recipe)
    quantized, step = _trainer(te, model, recipe)
    torch.manual_seed(7)
    equal = []
    for _ in range(3):
        x = torch.randn(32, 64, device=dev)
        equal.append(torch.equal(step(x)[0], ref_step(x)[0]))
    return {
        "quantized": len(quantized),
        "shards": sorted({type(_local(p)).__name__ for p in model.parameters()}),
        "equal": equal,
    }


def _mixed_precision(te, recipe, recipe_name: str, mesh, dev: str) -> dict:
    """FSDP2's MixedPrecisionPolicy(param_dtype=bf16) over FP8 weights: the gathered weight's
    nominal dtype is bf16, so the layers compute as one process fed bf16 does."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    ref, model = _build(te, 0, dev, recipe_name), _build(te, 0, dev, recipe_name)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    for m in model:
        fully_shard(m, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    x = torch.randn(32, 64, device=dev)
    with te.autocast(recipe=recipe):
        y, y_ref = model(x), ref(x.bfloat16())
    y.float().sum().backward()
    return {
        "dtype": str(y.dtype),
        "equal": torch.equal(y, y_ref),
        "grads": all(p.grad is not None for p in model.parameters()),
    }


def _high_precision(te, recipe, mesh, rank: int, world: int, dev: str) -> dict:
    """Weights in high precision (FSDP2's own sharding) under ``recipe`` with the amax reduced
    over the ranks, each rank fed its part of the batch, against one process fed all of it."""
    from _module_ref import delayed_states

    def build():
        torch.manual_seed(0)
        return torch.nn.Sequential(
            te.LayerNormLinear(64, 32, device=dev),
            te.Linear(32, 48, device=dev),
            te.LayerNormMLP(48, 96, device=dev),
        )

    ref, model = build(), build()
    for m in model:
        fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # one process's loss world x the ranks' (the same gradient of the output per row, so the same
    # backward amaxes), its step 1 / world as long: both exact scalings
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1 / world)
    torch.manual_seed(7)
    y_err = p_err = 0.0
    for _ in range(3):
        x = torch.randn(16 * world, 64, device=dev)
        mine = x.chunk(world)[rank]
        with te.autocast(recipe=recipe, amax_reduction_group=dist.group.WORLD):
            y = model(mine)
        y.float().pow(2).mean().backward()  # FSDP2 averages the ranks' mean gradients
        opt.step()
        opt.zero_grad()
        with te.autocast(recipe=recipe):
            y_ref = ref(x)
        (world * y_ref.float().pow(2).mean()).backward()
        ref_opt.step()
        ref_opt.zero_grad()
        y_err = max(y_err, (y - y_ref.chunk(world)[rank]).abs().max().item())
        for p, r in zip(model.parameters(), ref.parameters(), strict=True):
            p_err = max(p_err, (p.full_tensor() - r).abs().max().item())
    # the amaxes reduced over the ranks are the whole batch's: one process's scaling state
    states = [torch.equal(a, b) for a, b in zip(delayed_states(model), delayed_states(ref), strict=True)]
    return {"y_err": y_err, "p_err": p_err, "states": states}


def main() -> None:
    import te_torch as te

    dev = sys.argv[6]
    rank, world, path, (recipe_name, case, _) = init_rank(dev)
    mesh = dist.device_mesh.init_device_mesh(dev, (world,))
    recipe = _recipe(te, recipe_name)
    if case == "mixed_scales":
        out = _mixed_scales(te, recipe, recipe_name, mesh, rank, dev)
    elif case == "dcp":
        out = _dcp(te, recipe, recipe_name, mesh, path, dev)
    elif case == "mixed_precision":
        out = _mixed_precision(te, recipe, recipe_name, mesh, dev)
    elif case == "split_high":
        out = _split_high(te, recipe, mesh, dev)
    elif case == "high_precision":
        out = _high_precision(te, recipe, mesh, rank, world, dev)
    else:
        out = _train(te, recipe, recipe_name, mesh, rank, world, dev)
    finish(out)


if __name__ == "__main__":
    main()
