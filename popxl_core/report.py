"""``python -m popxl_core.report [--out DIR] SCRIPT [ARGS...]``: run a script, then write the
simulator's report of every Session it built.

For the n-th Session (in build order) it writes ``session_<n>.txt`` (summary, program tree and
the dearest ops), ``session_<n>.json`` (``SimReport.to_dict()``) and, when matplotlib is
installed, ``session_<n>.png`` (the liveness plot of IPU 0). A Session that failed with an
out-of-memory error is reported too: that is when the report is most wanted.
"""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

from .planning import PlanOnlyError
from .sim.oom import OutOfMemoryError
from .sim.plan import observed_plans

__all__ = ["main", "write_report"]


def write_report(plan, out: Path, stem: str) -> list[Path]:
    """Write one plan's text, JSON and (with matplotlib) PNG under ``out``."""
    report = plan.report()
    text = "\n\n".join(
        [
            report.summary(),
            "Program tree:\n" + report.program_tree(),
            "Dearest ops per run:\n" + report.op_table(),
        ]
    )
    written = [out / f"{stem}.txt", out / f"{stem}.json"]
    written[0].write_text(text + "\n")
    report.to_json(written[1])
    try:
        written.append(report.plot_liveness(out / f"{stem}.png"))
    except ImportError:
        pass  # the plot is an optional extra
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m popxl_core.report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("popxl_reports"),
        help="folder for the reports (default: ./popxl_reports)",
    )
    parser.add_argument("script", type=Path, help="the Python script to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    opts = parser.parse_args(argv)
    if not opts.script.is_file():
        parser.error(f"no such script: {opts.script}")
    with observed_plans() as plans:
        try:
            return _run(opts.script, opts.args)
        finally:  # a script that fails still gets the reports of the Sessions it built
            _write_reports(plans, opts.out)


def _write_reports(plans: list, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for i, plan in enumerate(plans, 1):
        write_report(plan, out, f"session_{i}")
    print(f"popxl_core.report: {len(plans)} Session(s) reported in {out}/")


def _run(script: Path, args: list[str]) -> int:
    """Run ``script`` as ``__main__`` with its own argv; its exit code (1 if it ran out of
    memory: the report of that Session is still written; 0 when a Session built in planning
    mode stops it, `popxl_core.planning`)."""
    saved = sys.argv, list(sys.path)
    sys.argv = [str(script), *args]
    sys.path.insert(0, str(script.resolve().parent))
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except OutOfMemoryError as e:
        print(f"{script}: {e}", file=sys.stderr)
        return 1
    except PlanOnlyError as e:  # planning mode (POPXL_SIM_PLAN): the plan was what we came for
        print(f"{script}: planned; stopped where it needs values ({e})", file=sys.stderr)
        return 0
    finally:
        sys.argv, sys.path[:] = saved
    return 0


if __name__ == "__main__":
    sys.exit(main())
