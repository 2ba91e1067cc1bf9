"""The loss-curve PNG: one panel per recipe, side by side, sharing the axes; each FP8 panel also
draws BF16's curve in grey, so a gap shows at a glance. matplotlib (Agg) when it is installed,
else te's own canvas (_png). The y axis starts after the first twentieth of the steps, where the
initial loss would squash the part worth comparing."""

from __future__ import annotations

import sys
from pathlib import Path

from _png import Canvas

_COLORS = {
    "bf16": (40, 40, 40),
    "delayed": (31, 119, 180),
    "current": (44, 160, 44),
    "block": (214, 39, 40),
}
_GREY = (175, 175, 175)


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average over ``window`` values (fewer at the start)."""
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def _curves(results: list[dict]) -> tuple[dict[str, list[float]], tuple[float, float]]:
    """Smoothed finite curves per recipe and the shared y range."""
    curves = {}
    for r in results:
        finite = [v for v in r.get("losses", []) if v == v and abs(v) != float("inf")]
        if finite:
            curves[r["recipe"]] = smooth(finite, max(1, len(finite) // 50))
    if not curves:
        return curves, (0.0, 1.0)
    shown = [v for c in curves.values() for v in c[len(c) // 20 :]]
    lo, hi = min(shown), max(shown)
    pad = 0.05 * (hi - lo) or 0.05
    return curves, (lo - pad, hi + pad)


def _title(r: dict) -> str:
    held = r.get("held_out_loss")
    return f"{r['recipe']}  held-out {held:.4f}" if isinstance(held, float) and held == held else r["recipe"]


def _matplotlib(path: Path, title: str, results: list[dict]) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    curves, ylim = _curves(results)
    fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 3.4), sharey=True, squeeze=False)
    for ax, r in zip(axes[0], results, strict=True):
        name = r["recipe"]
        if name != "bf16" and "bf16" in curves:
            ax.plot(curves["bf16"], color=[c / 255 for c in _GREY], lw=1, label="bf16")
        if name in curves:
            ax.plot(curves[name], color=[c / 255 for c in _COLORS.get(name, (0, 0, 0))], lw=1.3, label=name)
        ax.set_title(_title(r), fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylim(*ylim)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper right")
    axes[0][0].set_ylabel("training loss (nats/byte)")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _own(path: Path, title: str, results: list[dict]) -> None:
    curves, (lo, hi) = _curves(results)
    pw, ph, left, top, gap = 320, 220, 70, 50, 20
    canvas = Canvas(left + len(results) * (pw + gap), top + ph + 40)
    canvas.text(left, 8, title)
    canvas.text(4, top, f"{hi:.2f}")
    canvas.text(4, top + ph - 10, f"{lo:.2f}")
    steps = max((len(c) for c in curves.values()), default=1)
    for i, r in enumerate(results):
        x0 = left + i * (pw + gap)
        canvas.text(x0, top - 16, _title(r), scale=2)
        canvas.rect(x0, top, x0 + pw, top + ph, (0, 0, 0))
        canvas.text(x0, top + ph + 6, "0")
        canvas.text(x0 + pw - 40, top + ph + 6, str(steps))

        def draw(curve: list[float], color, width: int, x0=x0) -> None:
            pts = [
                (x0 + pw * j / max(1, steps - 1), top + ph * (hi - min(max(v, lo), hi)) / (hi - lo))
                for j, v in enumerate(curve)
            ]
            for (xa, ya), (xb, yb) in zip(pts, pts[1:], strict=False):
                canvas.line(xa, ya, xb, yb, color, width)

        if r["recipe"] != "bf16" and "bf16" in curves:
            draw(curves["bf16"], _GREY, 1)
        if r["recipe"] in curves:
            draw(curves[r["recipe"]], _COLORS.get(r["recipe"], (0, 0, 0)), 2)
    canvas.save(path)


def write_loss_png(path: str | Path, title: str, results: list[dict]) -> str:
    """Draws ``results`` (dicts with "recipe", "losses", "held_out_loss") into the PNG at
    ``path``; returns what drew it ("matplotlib" or "te canvas")."""
    if not results:
        raise ValueError("write_loss_png: results: expected at least one recipe's result, got none")
    path = Path(path)
    try:
        if _matplotlib(path, title, results):
            return "matplotlib"
    except Exception as e:  # an unattended run keeps its PNG even when matplotlib misbehaves
        print(
            f"write_loss_png: matplotlib failed ({type(e).__name__}: {e}); drawing it ourselves",
            file=sys.stderr,
        )
    _own(path, title, results)
    return "te canvas"
