"""Seed 001's training step alone, interleaved with its eager twin's step in one process.

`seed_epoch` times whole epochs (wall time, data loading included, one side after the
other). This runs the seed unchanged for a few batches to build its `train_session`, then
calls its `Session.run` on one batch and the twin's step (`seed_accuracy.forward`, autograd,
the twin's SGD) on the same batch, alternating, and prints the median CPU time of each::

    python -m benchmarks.seed_step --rounds 600

``--threads 1 2`` repeats the rounds at each torch thread count (``torch.set_num_threads``)
and ``--clock wall`` times wall time: with two OpenMP threads on a loaded host, a step's time
is mostly one thread waiting for the other to be scheduled, which the calling thread's CPU
time does not count.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from benchmarks.seed_epoch import seed_001, twin_weights

__all__ = ["main"]


def _seed_session(seed: Path):
    """The seed's training Session and input streams, and its initial weights."""
    from benchmarks import seed_accuracy as sa
    from popxl_core import compat

    sa.seed_runner.stage_data()
    compat.install()
    sa.seed_runner.cap_data_loaders(3)
    namespace: dict = {}
    _, weights = sa.run_seed(seed, shuffle_seed=0, namespace=namespace)
    return namespace["train_session"], namespace["train_input_streams"], weights


_CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}


def _median_ms(steps: dict, rounds: int, clock) -> dict[str, float]:
    """Median milliseconds of each step over ``rounds`` alternating calls after 50 warm-up."""
    times: dict[str, list[float]] = {n: [] for n in steps}
    for i in range(rounds + 50):
        for name in list(steps) if i % 2 else list(steps)[::-1]:
            start = clock()
            steps[name]()
            if i >= 50:
                times[name].append(clock() - start)
    return {n: statistics.median(t) * 1e3 for n, t in times.items()}


def main(argv: list[str] | None = None) -> None:
    from benchmarks import seed_accuracy as sa

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=600)
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--clock", choices=sorted(_CLOCKS), default="cpu")
    args = ap.parse_args(argv)
    seed = seed_001()
    if seed is None:
        raise SystemExit("seeds not found (set POPXL_FX_SEEDS_DIR)")
    torch.set_num_threads(args.threads[0])
    session, streams, weights = _seed_session(seed)
    images, labels = next(iter(sa.twin_loaders(sa.BATCH)[0]))
    feed = dict(zip(streams, [images.squeeze().float(), labels.int()]))  # as the seed feeds
    params = twin_weights(weights)
    opt = sa.Sgd(params, sa.SEEDS["001"]["lr"])
    steps = {
        "sim": lambda: session.run(feed),
        "eager": lambda: sa.twin_step(params, opt, images, labels),
    }
    with session:
        for threads in args.threads:
            torch.set_num_threads(threads)
            ms = _median_ms(steps, args.rounds, _CLOCKS[args.clock])
            print(
                f"seed 001 step ({args.clock} time, median of {args.rounds}, {threads} torch "
                f"threads): sim {ms['sim']:.3f} ms, eager twin {ms['eager']:.3f} ms, "
                f"sim / eager {ms['sim'] / ms['eager']:.2f}"
            )


if __name__ == "__main__":
    main()
