"""One rank of tests/torch/test_tensor_parallel.py: ``run`` starts the ranks as processes of this
file; each prints its findings as one JSON line.

    python _tp_rank.py RANK WORLD RENDEZVOUS_FILE CASE RECIPE DEVICE

CASE: linear (te.Linear split by columns and by rows, with and without sequence parallelism,
against the same shard in a te.Linear of its own with the collectives written out, and against the
whole layer in fp32), layernorm_linear (te.LayerNormLinear split by columns against the whole
layer in fp32), layernorm_mlp (te.LayerNormMLP's set_parallel_mode, gelu and swiglu, against the
whole MLP in fp32), mlp (Megatron's MLP: a column layer, gelu, a row layer, against the whole
MLP in fp32), errors (misuse that must fail on every rank before any collective). RECIPE: none
(high precision), current, delayed, block. DEVICE: cpu (gloo) or cuda (NCCL, one GPU a rank).
"""

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _ranks import finish, init_rank, run_ranks

K = N = 256  # the whole layer: 128 a rank over two ranks (a 1x128 block, a 128x128 tile)
M = 64  # tokens: 32 a rank with sequence parallelism
FFN = 512


def run(tmp_path, world: int, case: str, recipe: str, device: str = "cpu") -> list[dict]:
    """Runs the ranks of ``case`` and returns each rank's findings (asserting that all exit 0)."""
    return run_ranks(__file__, tmp_path, world, case, recipe, device)


# max |error| / max |value| against the whole layer in fp32: the written-out check is exact, this
# one says the shards and collectives compute the layer (a missing sum is off by ~0.5 or more)
TOLERANCE = {"none": 1e-5, "current": 0.12, "delayed": 0.12, "block": 0.12}
MLP_TOLERANCE = {"none": 1e-5, "current": 0.2}


def check_linear(ranks: list[dict], recipe: str) -> None:
    """Asserts the linear case's findings: exact against the written-out shards, within
    TOLERANCE of fp32, each split's output and input-gradient shapes."""
    for r in ranks:
        assert set(r) == {"column", "column_sp", "row", "row_sp"}
        for split, found in r.items():
            assert all(found["written_out_equal"].values()), (split, found)
            assert max(found["err"].values()) < TOLERANCE[recipe], (split, found)
        # a column layer returns its columns (its input's gradient: the input's rows with sp);
        # a row layer the whole output (its rows with sp)
        assert r["column"]["shapes"] == [[M, N // 2], [M, K]]
        assert r["column_sp"]["shapes"] == [[M, N // 2], [M // 2, K]]
        assert r["row"]["shapes"] == [[M, N], [M, K // 2]]
        assert r["row_sp"]["shapes"] == [[M // 2, N], [M, K // 2]]


def check_layernorm_linear(ranks: list[dict], recipe: str) -> None:
    """Asserts the layernorm_linear case's findings: within MLP_TOLERANCE of fp32 (a norm and a
    GEMM), the norm output returned gathered or not."""
    for r in ranks:
        for split in ("tp", "sp"):
            assert max(r[split]["err"].values()) < MLP_TOLERANCE[recipe], (split, r[split])
        assert r["tp"]["ln_out"] == [M, K] and r["sp"]["ln_out"] == [M // 2, K]
        assert r["sp"]["ln_out_gathered"] == [M, K]


def check_layernorm_mlp(ranks: list[dict], recipe: str) -> None:
    """Asserts the layernorm_mlp case's findings: within MLP_TOLERANCE of fp32 for each
    activation, split with and without sequence parallelism."""
    for r in ranks:
        assert set(r) == {f"{act}_{split}" for act in ("gelu", "swiglu") for split in ("tp", "sp")}
        for key, err in r.items():
            assert max(err.values()) < MLP_TOLERANCE[recipe], (key, err)


def check_mlp(ranks: list[dict], recipe: str) -> None:
    for r in ranks:
        for split in ("tp", "sp"):
            assert max(r[split].values()) < MLP_TOLERANCE[recipe], (split, r[split])


def _recipe(te, name: str):
    if name == "none":
        return None
    return {
        "current": te.recipe.Float8CurrentScaling,
        "delayed": te.recipe.DelayedScaling,
        "block": te.recipe.Float8BlockScaling,
    }[name]()


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over max |b|."""
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _step(te, module, recipe, x: torch.Tensor, dy: torch.Tensor) -> tuple:
    """(y, dx) of one forward (under te.autocast with ``recipe``) and backward(dy)."""
    x = x.detach().clone().requires_grad_()
    with te.autocast(enabled=recipe is not None, recipe=recipe):
        y = module(x)
    y.backward(dy)
    return y.detach(), x.grad


def _set(module, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    with torch.no_grad():
        module.weight.copy_(weight)
        if bias is not None:
            module.bias.copy_(bias)


def _reference(w, b, x, dy) -> dict:
    """The whole layer in fp32: y, dx, dw, db."""
    w, b, x = (t.detach().clone().requires_grad_() for t in (w, b, x))
    y = F.linear(x, w, b)
    y.backward(dy)
    return {"y": y.detach(), "dx": x.grad, "dw": w.grad, "db": b.grad}


def _linear(te, recipe, rank: int, world: int, dev: str) -> dict:
    torch.manual_seed(0)
    w = torch.randn(N, K, device=dev) * 0.05
    b = torch.randn(N, device=dev)
    x = torch.randn(M, K, device=dev)
    dy = torch.randn(M, N, device=dev)
    ref = _reference(w, b, x, dy)
    n, k, m = N // world, K // world, M // world
    cols, ks, rows = (
        slice(rank * n, rank * n + n),
        slice(rank * k, rank * k + k),
        slice(rank * m, rank * m + m),
    )
    out = {}
    for mode in ("column", "row"):
        for sp in (False, True):
            tp = te.Linear(
                K, N, parallel_mode=mode, tp_group=dist.group.WORLD, sequence_parallel=sp, device=dev
            )
            if mode == "column":
                # input: the whole activation (its rows with sp); output: this rank's columns
                _set(tp, w[cols], b[cols])
                y, dx = _step(te, tp, recipe, x[rows] if sp else x, dy[:, cols])
                # written out: the shard as a layer of its own on the whole input; dx summed
                own = te.Linear(K, n, device=dev)
                _set(own, w[cols], b[cols])
                y2, dx2 = _step(te, own, recipe, x, dy[:, cols])
                dist.all_reduce(dx2)
                dx2 = dx2[rows] if sp else dx2
                db2 = own.bias.grad
                want = {"y": ref["y"][:, cols], "dx": ref["dx"][rows] if sp else ref["dx"]}
                want |= {"dw": ref["dw"][cols], "db": ref["db"][cols]}
                db = tp.bias.grad
            else:
                # input: this rank's slice of the last dimension; output: summed (its rows with sp)
                _set(tp, w[:, ks], b)
                y, dx = _step(te, tp, recipe, x[:, ks], dy[rows] if sp else dy)
                own = te.Linear(k, N, bias=False, device=dev)
                _set(own, w[:, ks], None)
                y2, dx2 = _step(te, own, recipe, x[:, ks], dy)
                dist.all_reduce(y2)
                y2 = y2 + b
                y2 = y2[rows] if sp else y2
                db2 = (dy[rows] if sp else dy).sum(0)
                want = {"y": ref["y"][rows] if sp else ref["y"], "dx": ref["dx"][:, ks]}
                want |= {"dw": ref["dw"][:, ks], "db": ref["db"]}
                db = tp.bias.grad.clone()
                if sp:  # each rank's part of the bias gradient: the loop all-reduces it
                    dist.all_reduce(db)
            got = {"y": y, "dx": dx, "dw": tp.weight.grad, "db": db}
            out[f"{mode}{'_sp' if sp else ''}"] = {
                "written_out_equal": {
                    "y": torch.equal(y, y2),
                    "dx": torch.equal(dx, dx2),
                    "dw": torch.equal(tp.weight.grad, own.weight.grad),
                    "db": torch.equal(tp.bias.grad, db2),
                },
                "err": {key: _err(got[key], want[key]) for key in got},
                "shapes": [list(y.shape), list(dx.shape)],
            }
    return out


def _mlp(te, recipe, rank: int, world: int, dev: str) -> dict:
    torch.manual_seed(1)
    w1, b1 = torch.randn(FFN, K, device=dev) * 0.05, torch.randn(FFN, device=dev) * 0.1
    w2, b2 = torch.randn(K, FFN, device=dev) * 0.05, torch.randn(K, device=dev) * 0.1
    x, dy = torch.randn(M, K, device=dev), torch.randn(M, K, device=dev)
    leaves = [t.clone().requires_grad_() for t in (w1, b1, w2, b2, x)]
    y_ref = F.linear(
        F.gelu(F.linear(leaves[4], leaves[0], leaves[1]), approximate="tanh"), leaves[2], leaves[3]
    )
    y_ref.backward(dy)
    f, m = FFN // world, M // world
    fs, rows = slice(rank * f, rank * f + f), slice(rank * m, rank * m + m)
    out = {}
    for sp in (False, True):
        g = dist.group.WORLD
        fc1 = te.Linear(K, FFN, parallel_mode="column", tp_group=g, sequence_parallel=sp, device=dev)
        fc2 = te.Linear(FFN, K, parallel_mode="row", tp_group=g, sequence_parallel=sp, device=dev)
        _set(fc1, w1[fs], b1[fs])
        _set(fc2, w2[:, fs], b2)
        xin = (x[rows] if sp else x).clone().requires_grad_()
        with te.autocast(enabled=recipe is not None, recipe=recipe):
            y = fc2(F.gelu(fc1(xin), approximate="tanh"))
        y.backward(dy[rows] if sp else dy)
        db2 = fc2.bias.grad.clone()
        if sp:
            dist.all_reduce(db2)
        out["sp" if sp else "tp"] = {
            "y": _err(y, y_ref[rows] if sp else y_ref),
            "dx": _err(xin.grad, leaves[4].grad[rows] if sp else leaves[4].grad),
            "dw1": _err(fc1.weight.grad, leaves[0].grad[fs]),
            "db1": _err(fc1.bias.grad, leaves[1].grad[fs]),
            "dw2": _err(fc2.weight.grad, leaves[2].grad[:, fs]),
            "db2": _err(db2, leaves[3].grad),
        }
    return out


def _layernorm_linear(te, recipe, rank: int, world: int, dev: str) -> dict:
    """te.LayerNormLinear split by columns (the norm, then the column collective and GEMM)."""
    torch.manual_seed(2)
    w, b = torch.randn(N, K, device=dev) * 0.05, torch.randn(N, device=dev)
    gamma, beta = 1 + 0.1 * torch.randn(K, device=dev), 0.1 * torch.randn(K, device=dev)
    x, dy = torch.randn(M, K, device=dev) * 3 + 1, torch.randn(M, N, device=dev)
    leaves = [t.clone().requires_grad_() for t in (w, b, gamma, beta, x)]
    y_ref = F.linear(F.layer_norm(leaves[4], (K,), leaves[2], leaves[3], 1e-5), leaves[0], leaves[1])
    y_ref.backward(dy)
    n, m = N // world, M // world
    cols, rows = slice(rank * n, rank * n + n), slice(rank * m, rank * m + m)
    out = {}
    for sp in (False, True):
        layer = te.LayerNormLinear(
            K, N, parallel_mode="column", tp_group=dist.group.WORLD, sequence_parallel=sp,
            return_layernorm_output=True, device=dev,
        )  # fmt: skip
        _set(layer, w[cols], b[cols])
        with torch.no_grad():
            layer.layer_norm_weight.copy_(gamma)
            layer.layer_norm_bias.copy_(beta)
        xin = (x[rows] if sp else x).clone().requires_grad_()
        with te.autocast(enabled=recipe is not None, recipe=recipe):
            y, ln_out = layer(xin)
        y.backward(dy[:, cols])
        dgamma, dbeta = layer.layer_norm_weight.grad.clone(), layer.layer_norm_bias.grad.clone()
        if sp:  # each rank's part of the norm's gradients: the loop all-reduces them
            dist.all_reduce(dgamma)
            dist.all_reduce(dbeta)
        found = {"ln_out": list(ln_out.shape)}
        found["err"] = {
            "y": _err(y, y_ref[:, cols]),
            "dx": _err(xin.grad, leaves[4].grad[rows] if sp else leaves[4].grad),
            "dw": _err(layer.weight.grad, leaves[0].grad[cols]),
            "db": _err(layer.bias.grad, leaves[1].grad[cols]),
            "dgamma": _err(dgamma, leaves[2].grad),
            "dbeta": _err(dbeta, leaves[3].grad),
        }
        if sp:
            gathered = te.LayerNormLinear(
                K, N, parallel_mode="column", tp_group=dist.group.WORLD, sequence_parallel=True,
                return_layernorm_output=True, return_layernorm_output_gathered=True, device=dev,
            )  # fmt: skip
            found["ln_out_gathered"] = list(gathered(xin.detach())[1].shape)
        out["sp" if sp else "tp"] = found
    return out


def _layernorm_mlp(te, recipe, rank: int, world: int, dev: str) -> dict:
    """te.LayerNormMLP with set_parallel_mode (FC1 by columns, FC2 by rows): gelu, and swiglu,
    whose FC1 shard is this rank's rows of each half (activation, then gate)."""
    out = {}
    for act in ("gelu", "swiglu"):
        torch.manual_seed(3)
        gated = act == "swiglu"
        w1 = torch.randn((2 if gated else 1) * FFN, K, device=dev) * 0.05
        b1 = torch.randn(w1.shape[0], device=dev) * 0.1
        w2, b2 = torch.randn(K, FFN, device=dev) * 0.05, torch.randn(K, device=dev) * 0.1
        gamma, beta = 1 + 0.1 * torch.randn(K, device=dev), 0.1 * torch.randn(K, device=dev)
        x, dy = torch.randn(M, K, device=dev) * 2, torch.randn(M, K, device=dev)
        leaves = [t.clone().requires_grad_() for t in (w1, b1, w2, b2, gamma, beta, x)]
        h = F.linear(F.layer_norm(leaves[6], (K,), leaves[4], leaves[5], 1e-5), leaves[0], leaves[1])
        a = F.silu(h[:, :FFN]) * h[:, FFN:] if gated else F.gelu(h, approximate="tanh")
        y_ref = F.linear(a, leaves[2], leaves[3])
        y_ref.backward(dy)
        f, m = FFN // world, M // world
        fs, rows = slice(rank * f, rank * f + f), slice(rank * m, rank * m + m)
        mine = (
            torch.cat([torch.arange(FFN)[fs], FFN + torch.arange(FFN)[fs]])
            if gated
            else torch.arange(FFN)[fs]
        )
        for sp in (False, True):
            mlp = te.LayerNormMLP(
                K, FFN, activation=act, set_parallel_mode=True, tp_group=dist.group.WORLD,
                sequence_parallel=sp, device=dev,
            )  # fmt: skip
            with torch.no_grad():
                for p, v in zip(
                    (mlp.fc1_weight, mlp.fc1_bias, mlp.fc2_weight, mlp.fc2_bias),
                    (w1[mine], b1[mine], w2[:, fs], b2),
                    strict=True,
                ):
                    p.copy_(v)
                mlp.layer_norm_weight.copy_(gamma)
                mlp.layer_norm_bias.copy_(beta)
            xin = (x[rows] if sp else x).clone().requires_grad_()
            with te.autocast(enabled=recipe is not None, recipe=recipe):
                y = mlp(xin)
            y.backward(dy[rows] if sp else dy)
            parts = [mlp.fc2_bias.grad, mlp.layer_norm_weight.grad, mlp.layer_norm_bias.grad]
            parts = [t.clone() for t in parts]
            if sp:  # each rank's part of these gradients: the loop all-reduces them
                for t in parts:
                    dist.all_reduce(t)
            out[f"{act}_{'sp' if sp else 'tp'}"] = {
                "y": _err(y, y_ref[rows] if sp else y_ref),
                "dx": _err(xin.grad, leaves[6].grad[rows] if sp else leaves[6].grad),
                "dw1": _err(mlp.fc1_weight.grad, leaves[0].grad[mine]),
                "db1": _err(mlp.fc1_bias.grad, leaves[1].grad[mine]),
                "dw2": _err(mlp.fc2_weight.grad, leaves[2].grad[:, fs]),
                "db2": _err(parts[0], leaves[3].grad),
                "dgamma": _err(parts[1], leaves[4].grad),
                "dbeta": _err(parts[2], leaves[5].grad),
            }
    return out


def _errors(te, rank: int, world: int, dev: str) -> dict:
    """Each misuse's message (None where nothing was raised)."""
    g = dist.group.WORLD
    x = torch.randn(M, K, device=dev)
    msgs = {}

    def catch(name, fn):
        try:
            fn()
            msgs[name] = None
        except (ValueError, TypeError, RuntimeError, NotImplementedError) as e:
            msgs[name] = f"{type(e).__name__}: {e}"

    catch("size_mismatch", lambda: te.Linear(K, N, parallel_mode="column", tp_group=g, tp_size=world + 1))
    late = te.Linear(K, N, parallel_mode="column", tp_size=world, device=dev)
    catch("no_group", lambda: late(x))
    catch(
        "wrong_group",
        lambda: te.Linear(K, N, parallel_mode="row", tp_size=2 * world).set_tensor_parallel_group(g),
    )
    late.set_tensor_parallel_group(g)
    catch("group_set_later", lambda: late(x))
    row_sp = te.Linear(K, N, parallel_mode="row", tp_group=g, sequence_parallel=True, device=dev)
    catch("sp_rows", lambda: row_sp(torch.randn(M + 1, K // world, device=dev)))
    rec = te.recipe.Float8CurrentScaling()

    def under(fn):
        with te.autocast(recipe=rec):
            fn()

    row = te.Linear(K, N, parallel_mode="row", tp_group=g, device=dev)
    col = te.Linear(K, N, parallel_mode="column", tp_group=g, device=dev)
    catch("row_fp8_output", lambda: under(lambda: row(x[:, : K // world], fp8_output=True)))
    catch("column_fp8_grad", lambda: under(lambda: col(x.detach().requires_grad_(), fp8_grad=True)))
    # torch.compile runs a split layer's step eagerly (a graph break), with eager's numbers
    compiled = torch.compile(row, backend="eager")
    with te.autocast(recipe=rec):
        msgs["compiled_equal"] = torch.equal(compiled(x[:, : K // world]), row(x[:, : K // world]))
    return msgs


def main() -> None:
    import te_torch as te

    dev = sys.argv[6]
    rank, world, _, (case, recipe_name, _) = init_rank(dev)
    recipe = _recipe(te, recipe_name)
    if case == "mlp":
        out = _mlp(te, recipe, rank, world, dev)
    elif case == "layernorm_mlp":
        out = _layernorm_mlp(te, recipe, rank, world, dev)
    elif case == "layernorm_linear":
        out = _layernorm_linear(te, recipe, rank, world, dev)
    elif case == "errors":
        out = _errors(te, rank, world, dev)
    else:
        out = _linear(te, recipe, rank, world, dev)
    finish(out)


if __name__ == "__main__":
    main()
