"""The demo's corpus: this machine's Python standard library sources as bytes (GPU.md's
convergence data), so nothing is downloaded and every machine has it.

Every ``.py`` file under ``sysconfig``'s stdlib directory, site-packages and dist-packages
excluded, sorted by path, concatenated; the last ``held_out`` fraction is the held-out split.
Training batches are windows at random offsets drawn from a seeded generator, so every recipe
sees the same batches in the same order.
"""

from __future__ import annotations

import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

_EXCLUDED_DIRS = ("site-packages", "dist-packages")


def stdlib_files(root: str | os.PathLike | None = None) -> list[Path]:
    """The ``.py`` files under ``root`` (default: this Python's stdlib), sorted by path."""
    root = Path(sysconfig.get_paths()["stdlib"] if root is None else root)
    if not root.is_dir():
        raise FileNotFoundError(f"stdlib_files: root: expected a directory, got {str(root)!r}")
    files = []
    for d, dirs, names in os.walk(root):
        dirs[:] = [x for x in dirs if x not in _EXCLUDED_DIRS]
        files.extend(Path(d, n) for n in names if n.endswith(".py"))
    return sorted(files, key=str)


@dataclass
class Corpus:
    """``train`` and ``held_out``: uint8 CPU tensors of bytes; ``files``: how many files."""

    train: torch.Tensor
    held_out: torch.Tensor
    files: int

    def describe(self) -> str:
        total = self.train.numel() + self.held_out.numel()
        return (
            f"{self.files} stdlib .py files, {total / 1e6:.1f} MB "
            f"({self.held_out.numel() / 1e3:.0f} KB held out)"
        )


def load_corpus(held_out: float = 0.02, root: str | os.PathLike | None = None) -> Corpus:
    """The stdlib corpus split into train / held-out (the last ``held_out`` fraction)."""
    if not 0 < held_out < 1:
        raise ValueError(f"load_corpus: held_out: expected a fraction in (0, 1), got {held_out!r}")
    files = stdlib_files(root)
    data = b"".join(f.read_bytes() for f in files)
    if len(data) < 1024:
        raise ValueError(f"load_corpus: root: expected at least 1 KB of .py sources, found {len(data)} bytes")
    all_bytes = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    cut = len(data) - max(1, int(len(data) * held_out))
    return Corpus(all_bytes[:cut], all_bytes[cut:], len(files))


def train_offsets(n_bytes: int, seq: int, batch: int, steps: int, seed: int) -> torch.Tensor:
    """Window starts [steps, batch] (int64), uniform over the training bytes, from ``seed``."""
    if n_bytes < seq + 2:
        raise ValueError(f"train_offsets: n_bytes: expected more than seq + 1 = {seq + 1}, got {n_bytes}")
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n_bytes - seq - 1, (steps, batch), generator=g)


def windows(data: torch.Tensor, starts: torch.Tensor, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), int64 [len(starts), seq]: ``data[s : s + seq]`` and the next bytes."""
    idx = starts.to(data.device).unsqueeze(1) + torch.arange(seq + 1, device=data.device)
    w = data[idx].long()
    return w[:, :-1], w[:, 1:]


def held_out_starts(n_bytes: int, seq: int, limit: int | None = None) -> torch.Tensor:
    """Starts of the non-overlapping held-out windows (the first ``limit`` of them, if given)."""
    n = (n_bytes - 1) // seq
    if limit is not None:
        n = min(n, limit)
    if n < 1:
        raise ValueError(
            f"held_out_starts: n_bytes: expected more than seq={seq} held-out bytes, got {n_bytes}"
        )
    return torch.arange(n) * seq
