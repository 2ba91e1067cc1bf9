"""The GPT demo (examples/gpt) on the CPU: its model against a plain-torch forward, its data and
schedule against their definitions (GPU.md's convergence task), a few training steps under every
recipe, combining several seeds' runs into one row, and end-to-end runs that write the table, the
JSON and the PNG."""

import json
import math
import struct
import sys
import zlib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

_GPT = Path(__file__).resolve().parents[2] / "examples" / "gpt"
if str(_GPT) not in sys.path:
    sys.path.insert(0, str(_GPT))

import demo  # noqa: E402
from _data import Corpus, held_out_starts, load_corpus, stdlib_files, train_offsets, windows  # noqa: E402
from _model import GPT, GPTConfig  # noqa: E402
from _plot import smooth  # noqa: E402
from _png import Canvas  # noqa: E402
from _presets import PRESETS, RECIPES, TE_REFERENCE, Preset  # noqa: E402
from _report import checks_against_te, gap_pct, table  # noqa: E402
from _seeds import combine  # noqa: E402
from _train import lr_at, train  # noqa: E402

TINY = GPTConfig(seq=32, layers=1, hidden=128, heads=2, ffn=256)


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return load_corpus()


def reference_loss(model: GPT, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The GPT of _model's docstring in plain torch, from the te model's parameters (fp32)."""
    p = dict(model.named_parameters())
    cfg = model.cfg
    b, s = idx.shape
    x = p["wte.weight"][idx] + p["wpe.weight"][:s]
    for i in range(cfg.layers):
        k = f"blocks.{i}."
        h = F.layer_norm(x, (cfg.hidden,), p[k + "qkv.layer_norm_weight"], p[k + "qkv.layer_norm_bias"], 1e-5)
        qkv = F.linear(h, p[k + "qkv.weight"], p[k + "qkv.bias"])
        q, kk, v = (t.view(b, s, cfg.heads, -1).transpose(1, 2) for t in qkv.split(cfg.hidden, -1))
        scores = (q @ kk.transpose(-1, -2)) / math.sqrt(cfg.hidden // cfg.heads)
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        a = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, cfg.hidden)
        x = x + F.linear(a, p[k + "proj.weight"], p[k + "proj.bias"])
        h = F.layer_norm(x, (cfg.hidden,), p[k + "mlp.layer_norm_weight"], p[k + "mlp.layer_norm_bias"], 1e-5)
        h = F.gelu(F.linear(h, p[k + "mlp.fc1_weight"], p[k + "mlp.fc1_bias"]), approximate="tanh")
        x = x + F.linear(h, p[k + "mlp.fc2_weight"], p[k + "mlp.fc2_bias"])
    x = F.layer_norm(x, (cfg.hidden,), p["ln_f.weight"], p["ln_f.bias"], 1e-5)
    return F.cross_entropy((x @ p["wte.weight"].t()).view(-1, cfg.vocab), targets.reshape(-1))


def test_model_matches_plain_torch():
    torch.manual_seed(0)
    model = GPT(GPTConfig(seq=16, layers=2, hidden=64, heads=4, ffn=128), "cpu")
    with torch.no_grad():  # non-trivial norm parameters, so their wiring is checked too
        for name, t in model.named_parameters():
            if "layer_norm" in name or "ln_f" in name or name.endswith("bias"):
                t.copy_(torch.randn_like(t) * 0.3 + (1.0 if "weight" in name else 0.0))
    idx = torch.randint(0, 256, (3, 16))
    tgt = torch.randint(0, 256, (3, 16))
    torch.testing.assert_close(model.loss(idx, tgt), reference_loss(model, idx, tgt), rtol=1e-5, atol=1e-5)


def test_model_rejects_bad_input():
    model = GPT(GPTConfig(seq=8, layers=1, hidden=64, heads=2, ffn=64), "cpu")
    with pytest.raises(
        ValueError, match=r"GPT: idx: expected int64 \[batch, seq <= 8\], got torch.int64 \(2, 9\)"
    ):
        model(torch.zeros(2, 9, dtype=torch.int64))
    with pytest.raises(ValueError, match="GPTConfig: heads: expected a divisor of hidden=64, got 3"):
        GPTConfig(hidden=64, heads=3)


def test_corpus_is_the_sorted_stdlib_without_site_packages(tmp_path):
    for rel, text in {
        "b/x.py": "bb",
        "a.py": "a",
        "site-packages/s.py": "S",
        "c.txt": "C",
        "b/a.py": "ba",
    }.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text * 600)
    assert [str(f.relative_to(tmp_path)) for f in stdlib_files(tmp_path)] == ["a.py", "b/a.py", "b/x.py"]
    c = load_corpus(held_out=0.25, root=tmp_path)
    data = ("a" * 600 + "ba" * 600 + "bb" * 600).encode()
    assert bytes(c.train.tolist()) + bytes(c.held_out.tolist()) == data
    assert c.held_out.numel() == len(data) // 4 and c.files == 3
    with pytest.raises(ValueError, match=r"load_corpus: held_out: expected a fraction in \(0, 1\), got 0"):
        load_corpus(held_out=0, root=tmp_path)


def test_windows_are_next_byte_pairs():
    data = torch.arange(100, dtype=torch.uint8)
    x, y = windows(data, torch.tensor([0, 7]), 5)
    assert x.tolist() == [[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]] and (y == x + 1).all()
    assert held_out_starts(100, 10).tolist() == list(range(0, 90, 10))
    assert held_out_starts(100, 10, limit=3).tolist() == [0, 10, 20]
    a, b = train_offsets(1000, 16, 4, 3, seed=5), train_offsets(1000, 16, 4, 3, seed=5)
    assert a.shape == (3, 4) and torch.equal(a, b) and int(a.max()) < 1000 - 17


def test_lr_schedule():
    p = Preset("t", TINY, batch=1, steps=101, lr=1.0, warmup=10, min_lr_ratio=0.1)
    assert lr_at(0, p) == pytest.approx(0.1) and lr_at(9, p) == pytest.approx(1.0)
    assert lr_at(10, p) == pytest.approx(1.0)
    assert lr_at(55, p) == pytest.approx(0.55)  # halfway through the cosine: the mean of 1 and 0.1
    assert lr_at(100, p) == pytest.approx(0.1)
    assert all(lr_at(s, p) >= lr_at(s + 1, p) for s in range(10, 100))


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_training_lowers_the_loss(recipe, corpus):
    p = Preset("test", TINY, batch=4, steps=8, lr=3e-3, warmup=2, eval_windows=8, timing_skip=2, log_every=4)
    r = train(p, recipe, corpus, "cpu", show_progress=False)
    losses = r["losses"]
    assert len(losses) == 8 and all(math.isfinite(v) for v in losses) and r["diverged_at"] is None
    # The first step's loss is the fp32 plain-torch loss of the same init on the same batch, up to
    # bf16 (and FP8) rounding: same seed, init and batch order for every recipe.
    torch.manual_seed(p.seed)
    model = GPT(TINY, "cpu")
    starts = train_offsets(corpus.train.numel(), TINY.seq, p.batch, p.steps, p.seed)[0]
    with torch.no_grad():
        expected = reference_loss(model, *windows(corpus.train, starts, TINY.seq)).item()
    assert losses[0] == pytest.approx(expected, rel=3e-3)
    assert sum(losses[-2:]) / 2 < losses[0] - 0.5
    assert math.isfinite(r["held_out_loss"]) and r["held_out_loss"] < losses[0] - 0.5
    assert r["ms_per_step"] > 0 and r["peak_mib"] > 0


def test_train_rejects_unknown_recipe(corpus):
    with pytest.raises(
        ValueError,
        match=r"train: recipe_name: expected one of \['bf16', 'block', 'current', 'delayed'\], got 'mxfp8'",
    ):
        train(Preset("t", TINY, batch=1, steps=2), "mxfp8", corpus, "cpu")


def read_png(path: Path) -> tuple[int, int, bytes]:
    """(width, height, RGB rows) of an 8-bit RGB PNG without filtering, checking every CRC."""
    raw = path.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {}
    while pos < len(raw):
        (n,) = struct.unpack(">I", raw[pos : pos + 4])
        kind, body = raw[pos + 4 : pos + 8], raw[pos + 8 : pos + 8 + n]
        assert struct.unpack(">I", raw[pos + 8 + n : pos + 12 + n])[0] == zlib.crc32(kind + body)
        chunks[kind] = chunks.get(kind, b"") + body
        pos += 12 + n
    w, h, depth, color = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (depth, color) == (8, 2) and b"IEND" in chunks
    return w, h, zlib.decompress(chunks[b"IDAT"])


def test_canvas_png(tmp_path):
    c = Canvas(20, 10)
    c.line(0, 5, 19, 5, (255, 0, 0))
    c.rect(2, 1, 4, 3, (0, 0, 255), fill=True)
    c.save(tmp_path / "c.png")
    w, h, rows = read_png(tmp_path / "c.png")
    assert (w, h) == (20, 10) and len(rows) == 10 * (1 + 3 * 20)

    def pixel(x, y):
        i = y * (1 + 3 * w) + 1 + 3 * x
        return tuple(rows[i : i + 3])

    assert all(pixel(x, 5) == (255, 0, 0) for x in range(20))
    assert pixel(3, 2) == (0, 0, 255) and pixel(5, 2) == (255, 255, 255) and pixel(0, 0) == (255, 255, 255)


def test_smooth_is_a_trailing_mean():
    assert smooth([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]


def test_demo_end_to_end(tmp_path, capsys, monkeypatch):
    tiny = Preset("cpu-small", TINY, batch=2, steps=10, eval_windows=4, timing_skip=1)
    monkeypatch.setitem(demo.PRESETS, "cpu-small", tiny)
    rc = demo.main(["--device", "cpu", "--steps", "3", "--recipes", "bf16,current", "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "recipe   train loss  held-out" in out and "\nbf16 " in out and "\ncurrent " in out
    report = json.loads((tmp_path / "gpt_cpu-small.json").read_text())
    assert report["preset"] == "cpu-small" and report["config"]["steps"] == 3
    assert [r["recipe"] for r in report["results"]] == ["bf16", "current"]
    for r in report["results"]:
        assert len(r["losses"]) == 3 and all(math.isfinite(v) for v in r["losses"])
        assert math.isfinite(r["held_out_loss"])
    assert (tmp_path / "gpt_cpu-small.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_reports_a_failing_recipe_and_goes_on(tmp_path, capsys, monkeypatch):
    tiny = Preset("cpu-small", TINY, batch=2, steps=3, eval_windows=2, timing_skip=1)
    monkeypatch.setitem(demo.PRESETS, "cpu-small", tiny)
    real_train = demo.train

    def train_or_fail(p, name, corpus, device):
        if name == "delayed":
            raise RuntimeError("injected failure")
        return real_train(p, name, corpus, device, show_progress=False)

    monkeypatch.setattr(demo, "train", train_or_fail)
    rc = demo.main(["--device", "cpu", "--recipes", "delayed,current", "--out", str(tmp_path)])
    assert rc == 1
    assert "delayed  failed: RuntimeError: injected failure" in capsys.readouterr().out
    results = json.loads((tmp_path / "gpt_cpu-small.json").read_text())["results"]
    assert results[0]["error"] == "RuntimeError: injected failure" and "losses" not in results[0]
    assert len(results[1]["losses"]) == 3
    assert (tmp_path / "gpt_cpu-small.png").exists()


def test_presets_seeds():
    assert {n: p.seeds for n, p in PRESETS.items()} == {"cpu-small": 1, "gpu-convergence": 3, "gpu-large": 1}
    p = PRESETS["gpu-convergence"]
    assert p.seed_list == [1234, 1235, 1236]
    assert p.with_seed(7).seed == 7 and p.with_seed(7).with_steps(5).seed_list == [7, 8, 9]
    with pytest.raises(ValueError, match="Preset.with_seed: seed: expected an int, got 1.5"):
        p.with_seed(1.5)


def run(recipe, seed, held, final=2.0, ms=10.0, peak=100.0, diverged_at=None):
    """A hand-made result of train() for one seed, as run_preset hands it to combine."""
    return {
        "recipe": recipe,
        "seed": seed,
        "losses": [3.0, float(seed)],
        "final_loss": final,
        "held_out_loss": held,
        "ms_per_step": ms,
        "tokens_per_s": 1000.0 / ms * 1e3,
        "peak_mib": peak,
        "memory_kind": "peak RSS",
        "diverged_at": diverged_at,
    }


def test_combine_means_spread_median_max():
    runs = [
        run("delayed", 1, 1.50, final=2.0, ms=10.0, peak=100.0),
        run("delayed", 2, 1.56, final=2.3, ms=30.0, peak=130.0),
        run("delayed", 3, 1.53, final=2.1, ms=12.0, peak=110.0),
    ]
    row = combine(runs, tokens_per_step=1000)
    assert row["losses"] == [3.0, 1.0] and row["seed"] == 1  # the first seed's curve, for the PNG
    assert row["held_out_loss"] == pytest.approx(1.53) and row["final_loss"] == pytest.approx(6.4 / 3)
    assert row["held_out_spread"] == [1.50, 1.56]
    assert row["ms_per_step"] == 12.0 and row["tokens_per_s"] == pytest.approx(1000 / 12.0 * 1e3)
    assert row["peak_mib"] == 130.0
    assert row["per_seed"] == [
        {"seed": s, "held_out_loss": h, "final_loss": f, "ms_per_step": m, "diverged_at": None}
        for s, h, f, m in [(1, 1.50, 2.0, 10.0), (2, 1.56, 2.3, 30.0), (3, 1.53, 2.1, 12.0)]
    ]
    with pytest.raises(ValueError, match="combine: runs: expected at least one seed's result, got none"):
        combine([], 1000)


def test_one_seed_row_and_table_are_todays():
    runs = [run("bf16", 1234, 1.50), run("delayed", 1234, 1.53, ms=8.0)]
    rows = [combine([r], 1000) for r in runs]
    for r, row in zip(runs, rows, strict=True):
        assert {k: v for k, v in row.items() if k not in ("per_seed", "held_out_spread")} == r
        assert len(row["per_seed"]) == 1 and row["held_out_spread"] == [r["held_out_loss"]] * 2
    assert table(rows, TE_REFERENCE) == table(runs, TE_REFERENCE)
    assert checks_against_te(rows, TE_REFERENCE)["recipes"]["delayed"]["gap_pct_per_seed"] == [
        pytest.approx(2.0)
    ]
    out = table(rows, TE_REFERENCE)
    assert "\ndelayed      2.0000    1.5300   +2.00%" in out and "±" not in out and "per seed" not in out


def test_gap_is_the_mean_of_paired_per_seed_gaps():
    bf16 = combine([run("bf16", 1, 1.50), run("bf16", 2, 1.60)], 1000)
    delayed = combine([run("delayed", 1, 1.53), run("delayed", 2, 1.60)], 1000)
    # Paired: (+2% + 0%) / 2 = +1%; the gap of the means would be 100 * 0.03 / 1.55 = 1.94%.
    assert gap_pct(delayed, bf16) == pytest.approx(1.0)
    checks = checks_against_te([bf16, delayed], TE_REFERENCE)["recipes"]["delayed"]
    assert checks["gap_pct"] == pytest.approx(1.0) and checks["seeds"] == [1, 2]
    assert checks["gap_pct_per_seed"] == [pytest.approx(2.0), pytest.approx(0.0)]
    out = table([bf16, delayed], TE_REFERENCE)
    assert "\nbf16         2.0000 1.5500±0.0500        -      10.0" in out
    assert "\ndelayed      2.0000 1.5650±0.0350   +1.00%      10.0" in out
    assert "seeds 1, 2 per recipe: losses are means over the seeds, held-out ± half its range" in out
    assert "vs bf16: the mean of the per-seed gaps, each to bf16's run with the same seed" in out
    assert "delayed: gap +1.00% vs TE's +0.47% -> WORSE than TE's" in out
    assert "; gap per seed: +2.00% (1), +0.00% (2)" in out


def test_a_diverged_or_failed_seed_is_named_not_dropped():
    bf16 = combine([run("bf16", 1, 1.50), run("bf16", 2, 1.60)], 1000)
    diverged = combine([run("delayed", 1, 1.53), run("delayed", 2, float("nan"), 7.0, diverged_at=5)], 1000)
    assert math.isnan(diverged["held_out_loss"]) and diverged["held_out_spread"] is None
    assert diverged["per_seed"][1]["diverged_at"] == 5 and gap_pct(diverged, bf16) is None
    failed = {"recipe": "current", "seed": 1, "error": "RuntimeError: boom"}
    current = combine([failed, run("current", 2, 1.62, ms=20.0)], 1000)
    assert current["losses"] == [3.0, 2.0] and current["ms_per_step"] == 20.0  # the seed that ran
    assert math.isnan(current["held_out_loss"]) and math.isnan(current["final_loss"])
    assert current["per_seed"][0] == {"seed": 1, "error": "RuntimeError: boom"}
    checks = checks_against_te([bf16, diverged, current], TE_REFERENCE)["recipes"]
    assert checks["current"]["gap_pct"] is None
    assert checks["current"]["gap_pct_per_seed"] == [None, pytest.approx(100 * 0.02 / 1.6)]
    out = table([bf16, diverged, current], TE_REFERENCE)
    assert "(seed 2: loss not finite at step 5)" in out and "(seed 1: failed: RuntimeError: boom)" in out
    assert "\ndelayed           -             -        -      10.0" in out
    assert "current: gap - vs TE's +0.48%" in out and "gap per seed: - (1), +1.25% (2)" in out
    block = combine([{**failed, "recipe": "block"}, {**failed, "recipe": "block", "seed": 2}], 1000)
    assert block["error"] == "seed 1: RuntimeError: boom; seed 2: RuntimeError: boom"
    assert "\nblock    failed: seed 1: RuntimeError: boom; seed 2: RuntimeError: boom" in table([bf16, block])


def test_demo_seeds_end_to_end(tmp_path, capsys, monkeypatch):
    # Named gpu-convergence so the comparison with TE's figures (checks) is exercised too.
    tiny = Preset("gpu-convergence", TINY, batch=2, steps=10, eval_windows=4, timing_skip=1, seeds=3)
    monkeypatch.setitem(demo.PRESETS, "gpu-convergence", tiny)
    argv = ["--device", "cpu", "--preset", "gpu-convergence", "--seeds", "2", "--steps", "3"]
    rc = demo.main([*argv, "--recipes", "bf16,current", "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert ", seeds 1234, 1235\n" in out and "seeds 1234, 1235 per recipe" in out and "±" in out
    report = json.loads((tmp_path / "gpt_gpu-convergence.json").read_text())
    assert report["config"]["seeds"] == 2
    rows = {r["recipe"]: r for r in report["results"]}
    for r in rows.values():
        assert [e["seed"] for e in r["per_seed"]] == [1234, 1235] and r["seed"] == 1234
        held = [e["held_out_loss"] for e in r["per_seed"]]
        assert held[0] != held[1] and r["held_out_loss"] == pytest.approx(sum(held) / 2)
        assert r["held_out_spread"] == [min(held), max(held)]
    paired = [
        100 * (c["held_out_loss"] - b["held_out_loss"]) / b["held_out_loss"]
        for c, b in zip(rows["current"]["per_seed"], rows["bf16"]["per_seed"], strict=True)
    ]
    check = report["checks"]["recipes"]["current"]
    assert check["gap_pct_per_seed"] == pytest.approx(paired)
    assert check["gap_pct"] == pytest.approx(sum(paired) / 2)


def test_demo_rejects_zero_seeds(capsys):
    with pytest.raises(SystemExit):
        demo.main(["--seeds", "0"])
    assert "--seeds: expected an int >= 1, got 0" in capsys.readouterr().err
