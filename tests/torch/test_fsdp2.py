"""FSDP2 (fully_shard) over te modules whose weights are FP8 (te.quantized_model_init): the shards
stay FP8, the all-gather moves FP8 bytes, and training with fp32 master weights matches one process
bit for bit. Each case runs its ranks as processes over gloo on the CPU (the GPU's NCCL path is the
same Python with another backend)."""

import json
import os
import subprocess
import sys

import pytest
import torch

_SCRIPT = r"""
import json, sys, torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
import te_torch as te

rank, world, path, recipe_name, case = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
dist.init_process_group("gloo", init_method="file://" + path, rank=rank, world_size=world)
mesh = dist.device_mesh.init_device_mesh("cpu", (world,))
recipe = {"current": te.recipe.Float8CurrentScaling(), "delayed": te.recipe.DelayedScaling()}[recipe_name]


def build(seed):
    torch.manual_seed(seed)
    with te.quantized_model_init(recipe=te.recipe.Float8CurrentScaling()):
        return torch.nn.Sequential(
            te.LayerNormLinear(64, 32), te.Linear(32, 48), te.LayerNormMLP(48, 96, activation="swiglu")
        )


def local(t):
    return t.to_local() if isinstance(t, DTensor) else t


def trainer(model):
    # docs/linear.rst's master-weights loop, written for sharded and unsharded parameters alike
    qparams = [p for p in model.parameters() if isinstance(local(p), te.QuantizedTensor)]
    masters = [local(p).dequantize().float().requires_grad_() for p in qparams]
    ids = {id(p) for p in qparams}
    others = [p for p in model.parameters() if id(p) not in ids]
    opt = torch.optim.AdamW(masters + others, lr=1e-2)

    def step(x):
        with te.autocast(recipe=recipe):
            y = model(x)
        y.float().pow(2).mean().backward()
        grads = [local(p.grad).clone() for p in qparams]
        with torch.no_grad():
            for p, m in zip(qparams, masters):
                m.grad, p.grad = local(p.grad).float(), None
            opt.step()
            opt.zero_grad()
            for p, m in zip(qparams, masters):
                local(p).quantize_(m)
        return y.detach(), grads

    return qparams, step


out = {}
if case == "mixed_scales":
    model = build(rank)  # every rank its own weights: the shards' scales differ
    for m in model:
        fully_shard(m, mesh=mesh)
    try:
        with te.autocast(recipe=recipe):
            model(torch.randn(8, 64))
        out["error"] = None
    except RuntimeError as e:
        out["error"] = str(e)
elif case == "dcp":
    import torch.distributed.checkpoint as dcp

    a, b = build(0), build(1)
    for m in (*a, *b):
        fully_shard(m, mesh=mesh)
    x = torch.randn(8, 64)
    with te.autocast(recipe=recipe):
        y = a(x)
    dcp.save(a.state_dict(), checkpoint_id=path + ".ckpt")
    sd = b.state_dict()
    dcp.load(sd, checkpoint_id=path + ".ckpt")
    b.load_state_dict(sd)
    with te.autocast(recipe=recipe):
        out["equal"] = torch.equal(b(x), y)
    out["shard"] = type(local(b[0].weight)).__name__
else:
    ref = build(0)
    model = build(0)
    for m in model:
        fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    ref_q, ref_step = trainer(ref)
    q, step = trainer(model)
    shards = []
    for p, r in zip(q, ref_q):
        s = local(p)
        rows = torch.chunk(r._data.view(torch.uint8), world, dim=0)[rank]
        shards.append([
            type(s).__name__, s._data.element_size(), s._transpose is None,
            torch.equal(s._data.view(torch.uint8)[: rows.shape[0]], rows),
            torch.equal(s._scale_inv, r._scale_inv),
        ])
    out["shards"] = shards
    torch.manual_seed(7)
    steps = []
    for i in range(3):
        x = torch.randn(16, 64)  # the same batch on every rank, so FSDP's mean of the grads is exact
        y, grads = step(x)
        y_ref, grads_ref = ref_step(x)
        g_err = []
        for g, gr in zip(grads, grads_ref):
            piece = torch.chunk(gr, world, dim=0)[rank]
            g_err.append((g - piece).abs().max().item() / max(piece.abs().max().item(), 1e-30))
        steps.append({"y_equal": torch.equal(y, y_ref), "y_err": (y - y_ref).abs().max().item(),
                      "g_err": max(g_err), "scales_equal": all(
                          torch.equal(local(p)._scale_inv, r._scale_inv) for p, r in zip(q, ref_q))})
    out["steps"] = steps
    # what went over the wire for each FP8 weight (FSDP's all-gather buffers, a private field)
    wire = []
    for m in model:
        for fp in m._get_fsdp_state()._fsdp_param_group.fsdp_params:
            if isinstance(local(fp.sharded_param), te.QuantizedTensor):
                wire.append([str(t.dtype) for t in fp.all_gather_outputs])
    out["wire"] = wire
print(json.dumps(out))
dist.destroy_process_group()
"""


def _run(tmp_path, world: int, recipe: str, case: str) -> list[dict]:
    script = tmp_path / "fsdp2.py"
    script.write_text(_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), str(world), str(tmp_path / "rdzv"), recipe, case],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for rank in range(world)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


@pytest.mark.parametrize(
    "world, recipe",
    [(2, "current"), (2, "delayed"), (3, "current")],  # 3: uneven shards (32 / 48 / 96 rows)
)
def test_fsdp2_fp8_shards_train_as_one_process(tmp_path, world, recipe):
    ranks = _run(tmp_path, world, recipe, "train")
    for r in ranks:
        # every FP8 weight: a Float8Tensor shard of 1-byte elements, the reference's rows and scale
        assert len(r["shards"]) == 4
        for kind, size, rowwise_only, same_rows, same_scale in r["shards"]:
            assert (kind, size, rowwise_only, same_rows, same_scale) == ("Float8Tensor", 1, True, True, True)
        for s in r["steps"]:
            assert s["scales_equal"]  # quantize_ on a shard took the whole weight's amax
            if world == 2:  # (g + g) / 2 is exact: the gathered weights and outputs are the reference's
                assert s["y_equal"], s
                assert s["g_err"] == 0.0, s
            else:  # (g + g + g) / 3 rounds: an ulp apart, which the next steps carry
                assert s["y_err"] < 1e-6 and s["g_err"] < 1e-6, s
        assert r["steps"][0]["y_equal"]
        assert r["wire"] == [["torch.uint8"]] * 4  # the FP8 bytes alone, not a high-precision copy


def test_fsdp2_shards_with_different_scales_fail_on_every_rank(tmp_path):
    ranks = _run(tmp_path, 2, "current", "mixed_scales")
    for r in ranks:
        assert r["error"] is not None and "shards hold different scales" in r["error"]
        assert "same seed" in r["error"]


def test_float8_row_ops_keep_the_format():
    # the ops fully_shard shards with, on one process: split, new_zeros, narrow, view, as_strided
    import te_torch as te

    with te.quantized_model_init(recipe=te.recipe.Float8CurrentScaling()):
        m = te.Linear(64, 48)
    w = m.weight
    pieces = torch.chunk(w, 3, dim=0)
    assert all(type(p) is type(w) and p._transpose is None for p in pieces)
    assert torch.equal(torch.cat([p.dequantize() for p in pieces]), w.dequantize())
    # a piece of a tensor with a column-wise copy is a copy (its rows alone cannot be a view of
    # both copies): writes stay in it
    pieces[0].quantize_(torch.zeros(16, 64))
    assert w.dequantize()[:16].abs().max() > 0
    padded = w.new_zeros((20, 64))
    assert type(padded) is type(w) and padded._data.dtype == w._data.dtype
    padded.narrow(0, 0, 16).copy_(pieces[1])
    assert torch.equal(padded.dequantize()[:16], w.dequantize()[16:32])
    assert torch.equal(padded.dequantize()[16:], torch.zeros(4, 64))
    flat = padded.view(-1)
    assert type(flat) is type(w) and flat.shape == (20 * 64,)
    rows = torch.as_strided(padded, (10, 64), (64, 1))
    assert torch.equal(rows.dequantize(), padded.dequantize()[:10])
    # a view of rows shares the bytes: writing it writes the parent
    padded.narrow(0, 16, 4).copy_(pieces[2][:4])
    assert torch.equal(padded.dequantize()[16:], w.dequantize()[32:36])
    # with the column-wise copy present, a slice cannot be a view of both: high precision
    assert type(w[1:3]) is torch.Tensor
    assert torch.equal(w[1:3], w.dequantize()[1:3])


def test_a_block_scaled_weight_split_says_its_shards_are_high_precision(caplog):
    import logging

    import te_torch as te
    from te_torch import _info_once

    _info_once.told.discard("split:Float8BlockwiseQTensor")
    with te.quantized_model_init(recipe=te.recipe.Float8BlockScaling()):
        m = te.Linear(128, 256)
    with caplog.at_level(logging.INFO, logger="te"):
        pieces = torch.chunk(m.weight, 2, dim=0)
        torch.chunk(m.weight, 2, dim=0)
    assert all(type(p) is torch.Tensor for p in pieces)
    assert torch.equal(torch.cat(pieces), m.weight.dequantize())
    said = [r.getMessage() for r in caplog.records if "was split" in r.getMessage()]
    assert len(said) == 1 and "Float8BlockwiseQTensor parameter" in said[0] and "only Float8Tensor" in said[0]


def test_fsdp2_fp8_shards_round_trip_through_dcp(tmp_path):
    # torch.distributed.checkpoint saves the sharded FP8 weights and loads them into a model
    # built from other weights, which then computes the saved model's outputs bit for bit
    for r in _run(tmp_path, 2, "current", "dcp"):
        assert r == {"equal": True, "shard": "Float8Tensor"}
