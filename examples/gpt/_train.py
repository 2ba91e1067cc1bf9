"""One training run of the demo's GPT under one recipe: AdamW with warm-up and cosine decay,
gradient-norm clipping, bf16 autocast, the held-out loss at the end, tokens/s and peak memory.

Every run seeds the same generator before building the model and draws the same batch offsets,
so recipes differ only in their quantization. Losses stay on the device and are read every
``log_every`` steps (each read waits for the device), so the host keeps queueing work.

Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` (tensors only, reset per run). On the
CPU the peak resident set size of the process while the run lasted (Linux's VmHWM, reset per run
through /proc/self/clear_refs after returning freed heap with malloc_trim; where that is not
possible, ``resource.getrusage``'s ru_maxrss, the peak over the whole process so far). It
includes torch's own libraries, so on the CPU it compares recipes only roughly.
"""

from __future__ import annotations

import ctypes
import gc
import math
import re
import resource
import time
from contextlib import contextmanager

import te_torch as te
import torch
from _data import Corpus, held_out_starts, train_offsets, windows
from _model import GPT
from _presets import RECIPES, Preset
from _progress import progress


def lr_at(step: int, p: Preset) -> float:
    """Learning rate of ``step`` (0-based): linear warm-up to p.lr, cosine to p.min_lr_ratio * p.lr."""
    if step < p.warmup:
        return p.lr * (step + 1) / p.warmup
    t = (step - p.warmup) / max(1, p.steps - 1 - p.warmup)
    return p.lr * (p.min_lr_ratio + (1 - p.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


class _PeakMemory:
    """Peak memory of one run, in MiB; ``kind`` says what was measured."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            self.kind = "torch.cuda.max_memory_allocated"
        elif self._reset_hwm():
            self.kind = "peak RSS (VmHWM, reset per recipe)"
        else:
            self.kind = "peak RSS of the process (ru_maxrss)"

    @staticmethod
    def _reset_hwm() -> bool:
        try:
            ctypes.CDLL(None).malloc_trim(0)
        except (OSError, AttributeError):
            pass
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return _PeakMemory._hwm_kib() is not None
        except OSError:
            return False

    @staticmethod
    def _hwm_kib() -> int | None:
        try:
            with open("/proc/self/status") as f:
                m = re.search(r"VmHWM:\s+(\d+) kB", f.read())
        except OSError:
            return None
        return int(m.group(1)) if m else None

    def mib(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        kib = self._hwm_kib() if self.kind.startswith("peak RSS (VmHWM") else None
        if kib is None:
            kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        return kib / 1024


@contextmanager
def precision(device: torch.device, recipe):
    """bf16 autocast, and te's FP8 GEMMs under ``recipe`` (None: none)."""
    with torch.autocast(device.type, torch.bfloat16), te.autocast(enabled=recipe is not None, recipe=recipe):
        yield


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def held_out_loss(model: GPT, data: torch.Tensor, p: Preset, recipe, device: torch.device) -> float:
    """Mean loss over the held-out windows (``p.eval_windows`` of them, or all), under ``recipe``."""
    model.eval()
    starts = held_out_starts(data.numel(), p.model.seq, p.eval_windows)
    total = torch.zeros((), device=device)
    for chunk in starts.split(p.batch):
        x, y = windows(data, chunk, p.model.seq)
        with precision(device, recipe):
            total += model.loss(x, y) * len(chunk)
    model.train()
    return (total / len(starts)).item()


def train(
    p: Preset, recipe_name: str, corpus: Corpus, device: torch.device | str, show_progress: bool = True
) -> dict:
    """Trains ``p``'s model from scratch under ``recipe_name`` (a key of RECIPES) and returns
    {"recipe", "losses" (per step), "final_loss" (mean of the last tenth of the steps),
    "held_out_loss", "ms_per_step", "tokens_per_s", "peak_mib", "memory_kind", "diverged_at"}.
    Stops early, with ``diverged_at`` the step, when the loss stops being finite."""
    if recipe_name not in RECIPES:
        raise ValueError(f"train: recipe_name: expected one of {sorted(RECIPES)}, got {recipe_name!r}")
    device = torch.device(device)
    recipe = RECIPES[recipe_name]()
    memory = _PeakMemory(device)
    torch.manual_seed(p.seed)
    # Initialized on the CPU, then moved: the CPU generator gives the same weights whatever the
    # device, so a CUDA run starts from exactly the CPU run's model (CUDA's generator would not).
    model = GPT(p.model, "cpu").to(device)
    opt = torch.optim.AdamW(
        model.param_groups(p.weight_decay), lr=lr_at(0, p), betas=p.betas, fused=device.type == "cuda"
    )
    train_data, held_out = corpus.train.to(device), corpus.held_out.to(device)
    # On the device up front: a per-step host-to-device copy would wait for the queued work.
    offsets = train_offsets(train_data.numel(), p.model.seq, p.batch, p.steps, p.seed).to(device)
    losses = torch.full((p.steps,), float("nan"), device=device)
    bar = progress(p.steps, f"{p.name} {recipe_name:>7} seed {p.seed}") if show_progress else None
    diverged_at, t0, timed_steps, done = None, None, 0, 0
    for step in range(p.steps):
        if step == p.timing_skip:
            _sync(device)
            t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, p)
        x, y = windows(train_data, offsets[step], p.model.seq)
        with precision(device, recipe):
            loss = model.loss(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), p.grad_clip, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses[step] = loss.detach()
        done = step + 1
        if done % p.log_every == 0 or done == p.steps:
            window = losses[done - min(done, p.log_every) : done].cpu()
            if bar is not None:
                bar.set_postfix(loss=f"{window.mean().item():.3f}")
                bar.update(done - bar.n)
            if not torch.isfinite(window).all():
                diverged_at = done - min(done, p.log_every) + int((~torch.isfinite(window)).nonzero()[0])
                break
    _sync(device)
    if t0 is not None:
        elapsed = time.perf_counter() - t0
        timed_steps = done - p.timing_skip
    if bar is not None:
        bar.close()
    curve = losses[:done].cpu().tolist()
    held = held_out_loss(model, held_out, p, recipe, device) if diverged_at is None else float("nan")
    tail = curve[-max(1, done // 10) :]
    ms = 1e3 * elapsed / timed_steps if timed_steps > 0 else float("nan")
    return {
        "recipe": recipe_name,
        "losses": curve,
        "final_loss": sum(tail) / len(tail),
        "held_out_loss": held,
        "ms_per_step": ms,
        "tokens_per_s": p.tokens_per_step / ms * 1e3 if timed_steps > 0 else float("nan"),
        "peak_mib": memory.mib(),
        "memory_kind": memory.kind,
        "diverged_at": diverged_at,
    }
