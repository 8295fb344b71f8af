"""What phasing saves and costs: seed 003's phased program against the same MLP unphased.

Seed 003 is Graphcore's phased-execution tutorial (popxl.addons tutorial 6). Its own code
builds the phased training program (`tools/seed003.py` runs the seed's cells that define it;
nothing of the seed is copied here): 2 replicas, each running 4 accumulated micro-batches of
8, in seven phases (fc1, fc2, fc3 forward; the output layer's forward, loss and backward;
fc3, fc2, fc1 backward with Adam), weights and Adam state in Streaming Memory as RTS shards
(tensors of 512 elements or more), activations in remote buffers, transfers on IO tiles.
The unphased program is the same MLP from the seed's ``Net`` and ``Adam``: weights and Adam
state on chip, one replica, the global batch of 64 in one step.

The script prints the phased program's report and ``unphased.diff(phased)``: the variables
leave the chip (``variable_bytes``), and the most variable bytes on chip at once
(``variables_on_chip_peak_bytes``) drop to the largest phase's: fc1's backward phase, with
the shards of its weight, bias and Adam state and the gathered weight and bias. It writes both
JSON reports and both liveness plots (with matplotlib: the ``plot`` extra) to ``--out``.
Every figure is an estimate of the simulator's machine model.

Usage::

    python examples/phased_report.py --out phased_report_out [--seeds-dir ../shared/seeds]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import seed003

GLOBAL_BATCH = 8 * 4 * 2  # the seed's micro-batch x gradient accumulation x replicas


def reports(seeds_dir: Path | None):
    """The SimReports of seed 003's phased program and of the unphased MLP."""
    path = seed003.find(seeds_dir)
    if path is None:
        raise SystemExit(
            "seed 003 (003_*.txt) not found: pass --seeds-dir or set POPXL_FX_SEEDS_DIR"
        )
    ns = seed003.definitions(path)
    phased = seed003.phased_session(ns)[0]
    plain = seed003.unphased_program(ns, GLOBAL_BATCH)[0]
    return phased.report, plain.report


def plot(report, path: Path, title: str) -> None:
    try:
        print(f"liveness plot: {report.plot_liveness(path, title=title)}")
    except ImportError as e:
        print(f"no liveness plot: {e}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("phased_report_out"))
    ap.add_argument("--seeds-dir", type=Path, default=None)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    phased, plain = reports(args.seeds_dir)
    print("== seed 003, phased: 2 replicas x 4 micro-batches of 8, seven phases, RTS ==")
    print(phased.summary())
    print("\n== unphased (1 replica, batch 64, all on chip) vs phased (per replica) ==")
    diff = plain.diff(phased, ("unphased", "phased"))
    print(diff)
    before, after = diff["variables_on_chip_peak_bytes"]
    print(
        f"variables on chip at once: {before:,} B unphased, {after:,} B phased "
        f"(the largest phase's, {after / before:.2f}x)"
    )
    seconds = phased.totals()["estimated_seconds"]
    print(
        f"estimated time per training step of {GLOBAL_BATCH} samples: "
        f"{seconds * 1e3:.2f} ms (estimate, not a measurement)"
    )

    phased.to_json(args.out / "phased.json")
    plain.to_json(args.out / "unphased.json")
    plot(
        phased,
        args.out / "liveness_phased.png",
        "Seed 003 phased training step on ipu_hw, one replica (estimate)",
    )
    plot(
        plain,
        args.out / "liveness_unphased.png",
        "Seed 003's MLP unphased, batch 64, on ipu_hw (estimate)",
    )
    print(f"reports: {args.out}/phased.json, {args.out}/unphased.json")


if __name__ == "__main__":
    main()
