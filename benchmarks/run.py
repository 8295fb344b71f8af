"""Simulator vs eager PyTorch, side by side in one process: the table of issue 11.

Every step case runs the simulator's training step (`popxl_fx.training_model`) and its eager
twins in turn, rotating which goes first, for ``--repeats`` rounds after ``--warmup`` steps,
and reports the median time per step and the ratio simulator / eager (below 1: the simulator
is faster). torch runs on one thread (``--threads``), so machine load hits both alike.
Besides the step cases: the time to build a resnet50 training program (trace, lowering,
autodiff, optimizer, Session) and seed 001's training epoch in iterations per second, the
seed's own code beside its eager twin (benchmarks/seed_accuracy.py), when the seeds exist.

Usage::

    python -m benchmarks                                   # everything
    python -m benchmarks --cases mlp_sgd_b8 gpt_b8 --repeats 50
    python -m benchmarks --cases seed001 --seed-batches 1500
    python -m benchmarks --clock cpu                       # step cases in CPU time
    python -m benchmarks --cases resnet18_b16 --malloc-keep  # glibc keeps freed memory
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch

from benchmarks.cases import STEP_CASES, resnet

__all__ = ["time_side_by_side", "keep_freed_memory", "cold_compiles", "main", "CASES"]

EXTRA = ("resnet50_build", "seed001")
CASES = (*STEP_CASES, *EXTRA)
TARGETS = {
    "mlp_sgd_b8": "<= 0.8",
    "mlp_sgd_b256": "<= 1.0",
    "mlp_adam_b8": "<= 0.5 default, <= 1.0 fused",
    "mlp_adam_b256": "<= 0.5 default, <= 1.0 fused",
    "mlp_adam_fused_b8": "<= 0.5 default, <= 1.0 fused",
    "mlp_adam_fused_b256": "<= 0.5 default, <= 1.0 fused",
    "resnet18_b16": "<= 1.0",
    "gpt_b8": "<= 1.0",
    "resnet18_b16_inductor": "<= 0.9 torch.compile, build <= 1.5x",
    "gpt_b8_inductor": "<= 0.9 torch.compile, build <= 1.5x",
    "mlp_sgd_b32_r4": "<= 1.2 of one replica",
    "gpt_b8_r4": "<= 1.2 of one replica",
    "resnet50_build": "<= 3 s",
    "seed001": ">= eager twin it/s",
}


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}

# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_freed_memory() -> None:
    """Process-wide, for both sides of every case: glibc serves blocks up to 1 GiB from its
    heap instead of fresh mmaps (``M_MMAP_THRESHOLD``) and never gives freed heap memory back
    to the kernel (``M_TRIM_THRESHOLD``), so a step's buffers are not faulted in again each
    step. Only with ``--malloc-keep``: it changes what eager PyTorch costs as well."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = libc.mallopt(_M_MMAP_THRESHOLD, 2**30) and libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)
    except (OSError, AttributeError):
        ok = False
    if not ok:
        raise SystemExit("--malloc-keep needs glibc's mallopt (Linux with glibc)")


def time_side_by_side(
    fns: dict[str, Callable[[], object]], repeats: int, warmup: int, clock: str = "wall"
) -> dict[str, float]:
    """Median seconds per call of each function, calling them in rotating order. ``clock``
    "cpu" counts this thread's CPU time (user + system): on a machine shared with other
    busy processes it leaves out the time the step waited for a core."""
    now = CLOCKS[clock]
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    for i in range(warmup + repeats):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            start = now()
            fns[name]()
            elapsed = now() - start
            if i >= warmup:
                times[name].append(elapsed)
    return {n: statistics.median(ts) for n, ts in times.items()}


def step_rows(name: str, repeats: int, warmup: int, clock: str = "wall") -> list[str]:
    case = STEP_CASES[name]()
    start = time.perf_counter()
    case.sim()  # the build (and, with kernels="inductor", its compilation): not a step
    build = time.perf_counter() - start
    med = time_side_by_side({"sim": case.sim, **case.eager}, repeats, warmup, clock)
    rows = []
    for twin in case.eager:
        ratio = med["sim"] / med[twin]
        compile_s = case.compile_s.get(twin)
        built = f"{compile_s:.1f} s" if compile_s is not None else ""
        rows.append(
            f"| {name} | {twin} | {med['sim'] * 1e3:.3f} ms | {med[twin] * 1e3:.3f} ms "
            f"| {ratio:.2f} | {build:.1f} s | {built} | {TARGETS[name]} |"
        )
    return rows


def build_row(repeats: int) -> list[str]:
    """resnet50 (3x64x64, batch 16, SGD): seconds to build its training program, wall time
    and this process's CPU time (the part a busy machine does not inflate)."""
    walls, cpus = [], []
    for _ in range(max(1, min(repeats, 3))):
        case = resnet("resnet50", 16, 64)
        wall, cpu = time.perf_counter(), time.process_time()
        case.trainer.build(*case.inputs)  # trace, lower, autodiff, Session
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    wall, cpu = statistics.median(walls), statistics.median(cpus)
    return [
        f"| resnet50_build | (no eager twin) | {wall:.2f} s wall, {cpu:.2f} s CPU | | | | "
        f"| {TARGETS['resnet50_build']} |"
    ]


def seed_rows(seed_batches: int) -> list[str]:
    from benchmarks import seed_epoch

    sim, eager = seed_epoch.run(seed_batches)
    if sim is None:
        return ["| seed001 | seeds not found | | | | | | |"]
    return [
        f"| seed001 epoch ({sim.train_steps} steps) | eager twin | {sim.train_it_s:.0f} it/s "
        f"| {eager.train_it_s:.0f} it/s | {eager.train_it_s / sim.train_it_s:.2f} | | "
        f"| {TARGETS['seed001']} |"
    ]


def machine_line() -> str:
    """The CPU model (/proc/cpuinfo), cores, torch version and load: what the table needs to
    be read against."""
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model
            )
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"Machine: {model}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"load average {load:.1f} at start"
    )


HEADER = [
    "| case | eager side | simulator | eager side's time | sim / eager side | sim build + first "
    "step | eager side's compile | target |",
    "|---|---|---|---|---|---|---|---|",
]


def cold_compiles() -> None:
    """Compile columns time a cold compile: no FX graph (nor AOT autograd graph) reused from an
    earlier run's disk cache, for torch.compile's twin and the fast mode alike. Imported here,
    not at the top: torch._inductor takes ~1.4 s to import, and the test suite imports this
    module to collect its tests (test_benchmarks_clock.py)."""
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config

    inductor_config.fx_graph_cache = False
    functorch_config.enable_autograd_cache = False


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    ap.add_argument("--repeats", type=int, default=30, help="timed rounds per case")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="step cases: wall time, or the thread's CPU time (steadier on a loaded machine)",
    )
    ap.add_argument("--seed-batches", type=int, default=0, help="cap seed 001 (0: full epoch)")
    ap.add_argument(
        "--malloc-keep",
        action="store_true",
        help="glibc keeps freed memory (mallopt, process-wide: the simulator and eager alike)",
    )
    ap.add_argument(
        "--warm-cache",
        action="store_true",
        help="keep inductor's on-disk caches (FX graph, AOT autograd): compile columns then "
        "time a warm build, as a second run of the same program",
    )
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.warmup < 0 or args.threads < 1 or args.seed_batches < 0:
        ap.error("--repeats and --threads must be >= 1, --warmup and --seed-batches >= 0")
    torch.set_num_threads(args.threads)
    if args.malloc_keep:
        keep_freed_memory()
    if not args.warm_cache:
        cold_compiles()
    keep = ", glibc keeps freed memory (--malloc-keep)" if args.malloc_keep else ""
    print(machine_line() + keep + "\n", flush=True)
    print("\n".join(HEADER), flush=True)
    for name in args.cases:
        if name in STEP_CASES:
            rows = step_rows(name, args.repeats, args.warmup, args.clock)
        elif name == "resnet50_build":
            rows = build_row(args.repeats)
        else:
            rows = seed_rows(args.seed_batches)
        print("\n".join(rows), flush=True)


if __name__ == "__main__":
    main()
