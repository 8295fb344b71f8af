"""Seed 003 (phased execution) against the same MLP trained unphased, loss by loss.

The seed's code runs unchanged (tools/seed_runner.py): replication 2, gradient accumulation 4,
seven phases, remote variables with RTS, batch serialisation in "io" mode. While it trains,
this script records every batch the seed's training session is given, the losses it returns
and its weights before the first step. It then builds, with the seed's own ``Net`` and
``Adam`` modules, the plain program: one replica, the whole global batch of 64 in one step,
forward, loss, backward and Adam, no phases, no remote buffers, no sharding. That program
starts from the seed's initial weights and sees the same batches. Both sides compute the same
mean gradient (the seed as a mean over 4 steps of micro-batch means, then a mean over 2
replicas); they differ only in the order of float32 sums, so the losses agree to round-off.

    python benchmarks/seed003_unphased.py --max-batches 50

It prints each step's two losses (``--verbose``) and the worst absolute and relative
difference, the line tests/test_seeds.py reads.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import seed_runner  # noqa: E402
from seed003 import unphased_program  # noqa: E402

MICRO, GA, REPLICAS = 8, 4, 2  # the seed's opts.train
GLOBAL_BATCH = MICRO * GA * REPLICAS


class Recorder:
    """Wraps Session.run: records the training session's inputs, losses and first weights."""

    def __init__(self, namespace: dict) -> None:
        self.ns = namespace
        self.batches: list[tuple[np.ndarray, np.ndarray]] = []
        self.losses: list[np.ndarray] = []
        self.initial: dict[str, np.ndarray] = {}

    def install(self):
        from popxl_core.sim.session import Session

        real_run = Session.run
        rec = self

        def run(session, inputs=None, *args, **kwargs):
            train = rec.ns.get("train_session")
            if session is not train or inputs is None:
                return real_run(session, inputs, *args, **kwargs)
            if not rec.initial:
                rec.initial = rec._weights(session)
            out = real_run(session, inputs, *args, **kwargs)
            rec._record(inputs, out)
            return out

        Session.run = run
        return real_run

    def first(self, steps: int) -> "Recorder":
        """The same record cut to its first ``steps`` training steps."""
        cut = copy.copy(self)
        cut.batches, cut.losses = self.batches[:steps], self.losses[:steps]
        return cut

    def _weights(self, session) -> dict[str, np.ndarray]:
        variables = self.ns["train_variables"]
        data = session.get_tensors_data(variables.tensors)
        return {k: np.array(data[t], copy=True) for k, t in variables.named_tensors.items()}

    def _record(self, inputs, out) -> None:
        img, labels = (np.asarray(v) for v in inputs.values())
        self.batches.append((img.reshape(GLOBAL_BATCH, -1), labels.reshape(GLOBAL_BATCH)))
        self.losses.append(np.asarray(out[self.ns["loss_stream"]]))


def run_seed(path: Path, max_batches: int) -> Recorder:
    from popxl_core import compat

    compat.install()
    if max_batches:
        seed_runner.cap_data_loaders(max_batches)
    namespace: dict = {}
    rec = Recorder(namespace)
    real_run = rec.install()
    try:
        seed_runner.execute(path, echo=False, namespace=namespace)
    finally:
        from popxl_core.sim.session import Session

        Session.run = real_run
    steps = len(namespace["training_data"])  # later runs: the seed's throughput measurement
    rec.batches, rec.losses = rec.batches[:steps], rec.losses[:steps]
    return rec


def run_unphased(rec: Recorder, nudge: bool = False) -> list[float]:
    """The unphased losses; ``nudge`` starts from the initial weights moved one float32 ulp
    (``np.nextafter`` towards +inf): how far this training carries a round-off-sized change,
    the scale against which a different order of float32 sums is judged. (Feeding the rows
    in reverse order measured that once, but the IPU numerics' MatMul sums a row the same
    way wherever it sits, so reversed rows now change almost nothing.)"""
    session, (img, lbl), variables, loss_stream = unphased_program(rec.ns, GLOBAL_BATCH)
    start = {k: rec.initial[k] for k in variables.to_dict()}
    if nudge:
        start = {k: _one_ulp_up(v) for k, v in start.items()}
    session.write_variables_data({t: start[k] for k, t in variables.to_dict().items()})
    with session:
        return [float(session.run({img: x, lbl: y})[loss_stream]) for x, y in rec.batches]


def _one_ulp_up(value: np.ndarray) -> np.ndarray:
    value = np.asarray(value)
    if not np.issubdtype(value.dtype, np.floating):
        return value
    return np.nextafter(value, np.array(np.inf, value.dtype))


def compare(max_batches: int, seeds_dir: Path, verbose: bool) -> tuple[float, float]:
    path = next(seeds_dir.glob("003_*.txt"))
    return compare_recorded(run_seed(path, max_batches), verbose)


def compare_recorded(rec: Recorder, verbose: bool = False) -> tuple[float, float]:
    """The recorded phased training against the unphased program (and that program from
    weights 1 ulp away): prints the summary line and returns (worst difference, noise)."""
    phased = [float(np.mean(losses)) for losses in rec.losses]
    plain = np.array(run_unphased(rec))
    noise = np.abs(np.array(run_unphased(rec, nudge=True)) - plain)
    diffs = np.abs(np.array(phased) - plain)
    if verbose:
        for i, (a, b, n) in enumerate(zip(phased, plain, noise)):
            print(
                f"  step {i:4d}  phased {a:.7f}  unphased {b:.7f}  diff {a - b:+.2e}  "
                f"(weights 1 ulp away: {n:.2e})"
            )
    print(
        f"seed 003 phased vs unphased: {len(plain)} steps, loss {phased[0]:.4f} -> "
        f"{phased[-1]:.4f}; worst difference {diffs.max():.3e} absolute, "
        f"{(diffs / plain).max():.3e} relative; unphased from weights 1 ulp away: "
        f"{noise.max():.3e} absolute"
    )
    return float(diffs.max()), float(noise.max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-batches", type=int, default=50)
    ap.add_argument("--seeds-dir", type=Path, default=ROOT.parent / "shared" / "seeds")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument(
        "--shuffle-seed",
        type=int,
        default=0,
        help="torch's global seed, from which the seed's DataLoader shuffles",
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.shuffle_seed)
    seed_runner.stage_data()
    compare(args.max_batches, args.seeds_dir, args.verbose)


if __name__ == "__main__":
    main()
