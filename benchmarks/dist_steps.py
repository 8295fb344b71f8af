"""Steps per second of a replicated training step: R replicas as threads of one process vs
the same R replicas as P processes launched by torchrun (`popxl_core.distributed`).

    python -m benchmarks.dist_steps                    # R=2: 1 process vs 2 processes
    python -m benchmarks.dist_steps --replicas 4 --processes 2 --batch 32 --steps 40

The seed MLP (784-512-512-512-10, gelu) with SGD-momentum, ``Options(replication_factor=R)``,
``--batch`` rows per replica. Every process uses one torch thread (torchrun's default), so
the comparison is replicas-in-threads (one interpreter, one GIL) against replicas-in-processes
(one interpreter each, gradients exchanged over gloo on 127.0.0.1). The one-process run also
times eager PyTorch's step on the whole global batch, in the same process, for the ratio.
Wall-clock steps/s of rank 0 after a warm-up; the processes step in lockstep (every step
all-reduces the gradients), so rank 0's rate is the job's.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
_RESULT = re.compile(r"^RESULT (\S+) (\S+)$", re.M)


def _batches(replicas: int, batch: int, steps: int):
    g = torch.Generator().manual_seed(1)
    rows = replicas * batch
    return [
        (torch.randn(rows, 1, 28, 28, generator=g), torch.randint(0, 10, (rows,), generator=g))
        for _ in range(steps)
    ]


def _share(t: torch.Tensor) -> torch.Tensor:
    """This process's rows of a global batch (rank p: the p-th contiguous block)."""
    rank, size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    n = t.shape[0] // size
    return t[rank * n : (rank + 1) * n]


def _rate(step, data, warmup: int) -> float:
    for x, y in data[:warmup]:
        step(x, y)
    start = time.perf_counter()
    for x, y in data[warmup:]:
        step(x, y)
    return (len(data) - warmup) / (time.perf_counter() - start)


def worker(replicas: int, batch: int, steps: int, warmup: int = 3) -> None:
    import popxl_fx
    from benchmarks.cases import SeedMLP

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = SeedMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    options = popxl_fx.Options(device="cpu", replication_factor=replicas)
    trainer = popxl_fx.training_model(model, opt, F.cross_entropy, options)
    data = _batches(replicas, batch, steps + warmup)
    sim = _rate(lambda x, y: trainer(_share(x), _share(y)), data, warmup)
    eager = float("nan")
    if int(os.environ.get("WORLD_SIZE", 1)) == 1:
        torch.manual_seed(0)
        twin = SeedMLP()
        twin_opt = torch.optim.SGD(twin.parameters(), lr=0.01, momentum=0.9)

        def eager_step(x, y):
            twin_opt.zero_grad()
            F.cross_entropy(twin(x), y).backward()
            twin_opt.step()

        eager = _rate(eager_step, data, warmup)
    if os.environ.get("RANK", "0") == "0":
        print(f"RESULT {sim} {eager}", flush=True)
        _exchange_totals(steps + warmup)


def _exchange_totals(steps: int) -> None:
    from popxl_core import distributed

    ex = distributed.job_exchange()
    if ex is not None:
        print(
            f"EXCHANGE {ex.calls / steps:.1f} exchanges/step, {ex.bytes_sent / steps / 1e6:.2f} "
            f"MB sent/step, {1e3 * ex.seconds / steps:.1f} ms/step waiting in them",
            flush=True,
        )


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(processes: int, args) -> tuple:
    flags = ["--worker", "--replicas", str(args.replicas), "--batch", str(args.batch)]
    flags += ["--steps", str(args.steps)]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "benchmarks.dist_steps", *flags]
    if processes > 1:
        launcher = ["-m", "torch.distributed.run", f"--nproc_per_node={processes}"]
        launcher += ["--master_addr=127.0.0.1", f"--master_port={_free_port()}"]
        cmd = [sys.executable, *launcher, "-m", "benchmarks.dist_steps", *flags]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    found = _RESULT.search(done.stdout)
    if done.returncode or not found:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    exchanges = re.findall(r"^EXCHANGE (.*)$", done.stdout, re.M)
    return float(found.group(1)), float(found.group(2)), exchanges


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64, help="rows per replica")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.replicas, args.batch, args.steps)
    one, eager, _ = _run(1, args)
    many, _, exchanges = _run(args.processes, args)
    r, p = args.replicas, args.processes
    print(
        f"seed MLP, replication {r} x batch {args.batch}, SGD-momentum, 1 torch thread per "
        f"process ({os.cpu_count()} CPUs):\n"
        f"  1 process  ({r} replicas as threads): {one:7.2f} steps/s\n"
        f"  {p} processes ({r // p} replicas each):   {many:7.2f} steps/s   "
        f"({many / one:.2f}x the 1-process rate)\n"
        f"  eager PyTorch, global batch {r * args.batch}, 1 thread: {eager:7.2f} steps/s   "
        f"(1 process sim / eager {one / eager:.2f}x, {p} processes / eager {many / eager:.2f}x)"
    )
    for line in exchanges:
        print(f"  rank 0 of {p} processes: {line}")


if __name__ == "__main__":
    main()
