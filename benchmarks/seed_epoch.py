"""Seed 001's training epoch (its own code, data loading included) beside its eager twin.

The pieces are those of benchmarks/seed_accuracy.py: the seed runs unchanged under the import
hook, and the twin trains the same MLP from the seed's initial weights on the same batches.
Each side runs twice, in the order simulator, twin, twin, simulator, and its it/s is over
both of its epochs: whichever epoch runs first in the process is slower (the data pipeline
and the heap warm up: measured 0.92-0.95 eager / sim with the twin first against 0.99-1.08
with the simulator first), and this order gives each side one first and one later epoch in
the same positions, also cancelling a steady drift of the machine.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from popxl_fx.cli import default_seeds_dir

__all__ = ["run", "seed_001", "twin_weights"]


def seed_001() -> Path | None:
    """Seed 001's file, found as `tools/seed_runner.py` finds the seeds (None: not found)."""
    seeds_dir = default_seeds_dir()
    if seeds_dir is None or not os.path.isdir(seeds_dir):
        return None
    paths = sorted(p for p in os.listdir(seeds_dir) if p.startswith("001_"))
    return Path(seeds_dir) / paths[0] if paths else None


def run(max_batches: int = 0):
    """(simulator Result, eager Result) of seed 001, or (None, None) without the seeds; each
    Result's ``train_it_s`` over its two epochs (`_combined`)."""
    seed = seed_001()
    if seed is None:
        return None, None
    from benchmarks import seed_accuracy as sa
    from popxl_core import compat

    sa.seed_runner.stage_data()
    compat.install()
    if max_batches:
        sa.seed_runner.cap_data_loaders(max_batches)
    sim_a, weights = sa.run_seed(seed, shuffle_seed=0)
    loaders = sa.twin_loaders(sa.BATCH)
    twin = [sa.run_twin("001", loaders, twin_weights(weights), False, 0) for _ in "ab"]
    sim_b, _ = sa.run_seed(seed, shuffle_seed=0)
    return _combined(sim_a, sim_b), _combined(*twin)


def _combined(a, b):
    """``a`` with ``train_it_s`` over both epochs: all their steps over all their time."""
    seconds = a.train_steps / a.train_it_s + b.train_steps / b.train_it_s
    return dataclasses.replace(a, train_it_s=(a.train_steps + b.train_steps) / seconds)


def twin_weights(weights):
    """The seed's initial weights as leaves of the twin's own (it updates them in place)."""
    return [w.detach().clone().requires_grad_() for w in weights]
