"""What ``Ir.numerics = "ipu"`` costs hand-written PopXL: seed 001's MLP training step, A/B.

The same program (784-512-512-512-10 with gelu, autodiff, SGD update) is built twice, once per
numerics setting, and the two Sessions run in alternating order in one process; prints the
median milliseconds per step of each and their ratio. Usage::

    python -m benchmarks.numerics_ab --batch 8 --runs 300 [--cpu-time]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

import popxl_core as popxl
from popxl_core import ops, transforms

__all__ = ["mlp_step", "main"]

SIZES = [(784, 512), (512, 512), (512, 512), (512, 10)]


def _forward(x, *ws):
    for w in ws[:-1]:
        x = ops.gelu(x @ w)
    return x @ ws[-1]


def mlp_step(numerics: str, batch: int, seed: int = 0) -> Callable[[], object]:
    """One training step of the seed MLP as a hand-written PopXL program, ready to call."""
    rng = np.random.default_rng(seed)
    ir = popxl.Ir()
    ir.numerics = numerics
    with ir.main_graph, popxl.in_sequence():
        stream = popxl.h2d_stream((batch, 784), popxl.float32, "x")
        x = ops.host_load(stream, "x")
        ws = [
            popxl.variable(rng.standard_normal(s).astype(np.float32) * 0.05, name=f"w{i}")
            for i, s in enumerate(SIZES)
        ]
        graph = ir.create_graph(_forward, x, *ws)
        info = transforms.autodiff(graph)
        site = ops.call_with_info(graph, x, *ws)
        cotangent = popxl.constant(np.ones((batch, 10), np.float32))
        grads = ops.call(info.graph, cotangent, inputs_dict=info.inputs_dict(site))
        for w, g in zip(ws, grads[-len(ws) :]):
            ops.scaled_add_(w, g, b=-1e-3)
    session = popxl.Session(ir, "ipu_hw")
    session.__enter__()  # stays attached for the whole benchmark
    feed = {stream: rng.standard_normal((batch, 784)).astype(np.float32)}
    return lambda: session.run(feed)


def _median_ms(
    steps: dict[str, Callable[[], object]],
    runs: int,
    warmup: int,
    clock: Callable[[], float] = time.perf_counter,
) -> dict:
    times: dict[str, list[float]] = {n: [] for n in steps}
    for i in range(warmup + runs):
        order = list(steps) if i % 2 else list(steps)[::-1]
        for name in order:
            start = clock()
            steps[name]()
            if i >= warmup:
                times[name].append(clock() - start)
    return {n: statistics.median(t) * 1e3 for n, t in times.items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument(
        "--cpu-time",
        action="store_true",
        help="time the thread's CPU time instead of wall time (a loaded machine)",
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    steps = {n: mlp_step(n, args.batch) for n in ("ipu", "torch")}
    clock = time.thread_time if args.cpu_time else time.perf_counter
    ms = _median_ms(steps, args.runs, args.warmup, clock)
    kind = "CPU" if args.cpu_time else "wall"
    print(
        f"batch {args.batch} ({kind} time): ipu {ms['ipu']:.2f} ms, torch {ms['torch']:.2f} ms, "
        f"ipu / torch {ms['ipu'] / ms['torch']:.2f}"
    )


if __name__ == "__main__":
    main()
