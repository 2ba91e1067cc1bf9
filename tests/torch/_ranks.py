"""Runs a test's ranks as processes over torch.distributed (gloo on the CPU, NCCL with one GPU a
rank): ``run_ranks`` starts ``python SCRIPT RANK WORLD RENDEZVOUS_FILE ARGS...`` once a rank; the
script calls ``init_rank`` first and ends with ``finish(findings)``, which prints them as the one
JSON line ``run_ranks`` returns for that rank."""

import json
import os
import subprocess
import sys

import torch
import torch.distributed as dist


def run_ranks(script: str, tmp_path, world: int, *args: str) -> list[dict]:
    """Each rank's findings (asserting that every rank exits 0)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    rdzv = str(tmp_path / "rdzv")
    procs = [
        subprocess.Popen(
            [sys.executable, script, str(rank), str(world), rdzv, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for rank in range(world)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, f"rank exit status {p.returncode}; stdout: {out[-300:]!r}; stderr: {err}"
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


def init_rank(dev: str) -> tuple[int, int, str, list[str]]:
    """(rank, world, rendezvous file, the script's own arguments) from sys.argv, with the default
    process group up on ``dev`` ('cpu': gloo; 'cuda': NCCL, this rank's GPU current)."""
    rank, world, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    backend = "nccl" if dev == "cuda" else "gloo"
    dist.init_process_group(backend, init_method="file://" + path, rank=rank, world_size=world)
    if dev == "cuda":
        torch.cuda.set_device(rank)
    return rank, world, path, sys.argv[4:]


def finish(findings: dict) -> None:
    """Prints ``findings`` and leaves without the interpreter's teardown: twice in a few hundred
    runs under load a rank aborted there ("terminate called without an active exception", a
    joinable thread destroyed at exit, not te's: te-core starts none) after its findings were
    out."""
    print(json.dumps(findings), flush=True)
    dist.destroy_process_group()
    os._exit(0)
