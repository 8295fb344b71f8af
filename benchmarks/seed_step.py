"""Seed 001's training step alone, interleaved with its eager twin's step in one process.

`seed_epoch` times whole epochs (wall time, data loading included, one side after the
other). This runs the seed unchanged for a few batches to build its `train_session`, then
calls its `Session.run` on one batch and the twin's step (`seed_accuracy.forward`, autograd,
the twin's SGD) on the same batch, alternating, and prints the median CPU time of each::

    python -m benchmarks.seed_step --rounds 600
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from popxl_fx.cli import default_seeds_dir

__all__ = ["main"]


def _seed_session(seeds_dir: str):
    """The seed's training Session and input streams, and its initial weights."""
    from benchmarks import seed_accuracy as sa
    from popxl_core import compat

    path = sorted(p for p in os.listdir(seeds_dir) if p.startswith("001_"))[0]
    sa.seed_runner.stage_data()
    compat.install()
    sa.seed_runner.cap_data_loaders(3)
    seen: dict = {}
    initial = sa.initial_weights

    def keep(namespace):
        seen.update(namespace)
        return initial(namespace)

    sa.initial_weights = keep
    try:
        _, weights = sa.run_seed(Path(seeds_dir) / path, shuffle_seed=0)
    finally:
        sa.initial_weights = initial
    return seen["train_session"], seen["train_input_streams"], weights


def main(argv: list[str] | None = None) -> None:
    from benchmarks import seed_accuracy as sa

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=600)
    args = ap.parse_args(argv)
    seeds_dir = default_seeds_dir()
    if seeds_dir is None or not os.path.isdir(seeds_dir):
        raise SystemExit("seeds not found (set POPXL_FX_SEEDS_DIR)")
    torch.set_num_threads(1)
    session, streams, weights = _seed_session(seeds_dir)
    images, labels = next(iter(sa.twin_loaders(sa.BATCH)[0]))
    feed = dict(zip(streams, [images.squeeze().float(), labels.int()]))  # as the seed feeds
    params = [w.detach().clone().requires_grad_() for w in weights]
    opt = sa.Sgd(params, sa.SEEDS["001"]["lr"])

    def eager() -> None:
        loss = F.cross_entropy(sa.forward(params, images), labels)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            opt.step(grads)

    steps = {"sim": lambda: session.run(feed), "eager": eager}
    times: dict[str, list[float]] = {n: [] for n in steps}
    with session:
        for i in range(args.rounds + 50):
            for name in list(steps) if i % 2 else list(steps)[::-1]:
                start = time.thread_time()
                steps[name]()
                if i >= 50:
                    times[name].append(time.thread_time() - start)
    ms = {n: statistics.median(t) * 1e3 for n, t in times.items()}
    print(
        f"seed 001 step (CPU time, median of {args.rounds}): sim {ms['sim']:.3f} ms, "
        f"eager twin {ms['eager']:.3f} ms, sim / eager {ms['sim'] / ms['eager']:.2f}"
    )


if __name__ == "__main__":
    main()
