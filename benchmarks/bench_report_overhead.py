"""The report costs nothing per step: `Session.run` with and without the report in use.

Two Sessions of the same training step (examples/sim_report.py, outlined, batch 8) run
alternately on the same batches in this process. Session "report" has its report fully
produced (summary, JSON, program tree, op table, liveness and, with matplotlib, the plot) and
re-read between steps; session "plain" never touches its report. Also printed: the one-time
cost of planning (paid when a Session is built) and of producing the report.

Usage::

    python benchmarks/bench_report_overhead.py --rounds 300
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from popxl_core.sim.plan import build_plan

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _example():
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    return importlib.import_module("sim_report")


def _produce(report, folder: Path) -> None:
    """Everything the report offers, as a user would ask for it."""
    report.summary(), report.program_tree(), report.op_table(), report.liveness()
    report.to_json(folder / "r.json")
    try:
        report.plot_liveness(folder / "r.png")
    except ImportError:
        pass


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run(rounds: int, warmup: int) -> dict[str, list[float]]:
    """Seconds per `Session.run` for "plain" and "report", alternating."""
    ex = _example()
    plain, with_report = ex.training_step(outline=True), ex.training_step(outline=True)
    rng = np.random.default_rng(0)
    batches = [
        (
            rng.uniform(0, 1, (ex.BATCH, 28, 28)).astype(np.float32),
            rng.integers(0, 10, ex.BATCH).astype(np.int32),
        )
        for _ in range(8)
    ]
    times: dict[str, list[float]] = {"plain": [], "report": []}
    folder = Path(tempfile.mkdtemp())
    _produce(with_report[0].report, folder)
    with plain[0], with_report[0]:
        for i in range(warmup + rounds):
            order = [("plain", plain), ("report", with_report)][:: 1 if i % 2 == 0 else -1]
            for name, (session, streams, _, _) in order:
                feed = dict(zip(streams, batches[i % len(batches)]))
                t = _seconds(lambda s=session, f=feed: s.run(f))
                if i >= warmup:
                    times[name].append(t)
            with_report[0].report.to_dict()  # the report in use between steps
    return times


def one_time_costs() -> dict[str, float]:
    """Seconds to plan the step's Ir once, and to produce its whole report."""
    ex = _example()
    session = ex.training_step(outline=True)[0]
    plan_s = _seconds(lambda: build_plan(session.ir, session.machine))
    folder = Path(tempfile.mkdtemp())
    report_s = _seconds(lambda: _produce(build_plan(session.ir, session.machine).report(), folder))
    return {"plan": plan_s, "report": report_s - plan_s}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    times = run(args.rounds, args.warmup)
    med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    print(
        f"Session.run of the outlined MNIST training step, batch 8, {args.rounds} rounds "
        f"after {args.warmup} warm-up, {torch.get_num_threads()} torch thread(s) (ms/run)"
    )
    for name in ("plain", "report"):
        print(
            f"  {name:8s} median {med[name]:7.3f}   mean {1e3 * statistics.fmean(times[name]):7.3f}"
        )
    print(f"  ratio report/plain median {med['report'] / med['plain']:.3f}x")
    once = one_time_costs()
    print(
        f"one-time: planning {1e3 * once['plan']:.1f} ms (at Session build), producing the "
        f"whole report {1e3 * once['report']:.1f} ms (on request)"
    )


if __name__ == "__main__":
    main()
