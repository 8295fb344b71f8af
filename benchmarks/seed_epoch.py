"""Seed 001's training epoch (its own code, data loading included) beside its eager twin.

The pieces are those of benchmarks/seed_accuracy.py: the seed runs unchanged under the import
hook, and the twin trains the same MLP from the seed's initial weights on the same batches.
"""

from __future__ import annotations

import os

from popxl_fx.cli import default_seeds_dir

__all__ = ["run"]


def run(max_batches: int = 0):
    """(simulator Result, eager Result) of seed 001, or (None, None) without the seeds."""
    seeds_dir = default_seeds_dir()
    if seeds_dir is None or not os.path.isdir(seeds_dir):
        return None, None
    paths = sorted(p for p in os.listdir(seeds_dir) if p.startswith("001_"))
    if not paths:
        return None, None
    from benchmarks import seed_accuracy as sa
    from popxl_core import compat

    sa.seed_runner.stage_data()
    compat.install()
    if max_batches:
        sa.seed_runner.cap_data_loaders(max_batches)
    sim, weights = sa.run_seed(sa.Path(seeds_dir) / paths[0], shuffle_seed=0)
    eager = sa.run_twin("001", sa.twin_loaders(sa.BATCH), weights, False, 0)
    return sim, eager
