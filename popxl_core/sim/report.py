"""`SimReport`: the simulator's memory and cycle estimates of a Session, as text or JSON.

Example:
    >>> import popxl_core as popxl
    >>> ir = popxl.Ir()
    >>> with ir.main_graph:
    ...     w = popxl.variable([1.0, 2.0], name="w")
    >>> print(popxl.Session(ir, "ipu_model").report.summary().splitlines()[0])
    IPU memory (estimate, ipu_model: 4 tiles x 624 KiB = 2.44 MiB per IPU, per replica)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .units import fmt_bytes, fmt_seconds

__all__ = ["ESTIMATE_NOTE", "SimReport", "fmt_bytes", "fmt_seconds"]

ESTIMATE_NOTE = (
    "Estimate from the simulator's machine model (popxl_core/sim/machine.py): per-run and "
    "per-stream fixed costs fitted to Graphcore's published MNIST tutorial timings "
    "(popxl_core/sim/calibration.py); not a measurement."
)


def _fmt_percent(fraction: float) -> str:
    pct = 100 * fraction
    return f"{pct:.1f}%" if pct >= 0.1 or pct == 0 else f"{pct:.2g}%"


class SimReport:
    """The estimates of one `Plan`: ``summary()`` for people, ``to_dict()`` for tools.

    Every number is an estimate from the simulator's machine model (ipu_model.md §2), as
    the IPU Model's cycle counts are; memory is per IPU of one replica, time per
    ``Session.run`` of one replica (replicas run in parallel).
    """

    def __init__(self, plan) -> None:
        self.plan = plan

    # text ---------------------------------------------------------------------------
    def summary(self) -> str:
        """A compact, human-readable block: memory per IPU, time and work per run."""
        outlined = self.outlining()
        extra = [outlined.line()] if outlined.call_sites else []
        return "\n".join(
            [
                self._target_line(),
                *self._memory_lines(),
                *extra,
                self._time_line(),
                self._work_line(),
                self._traffic_line(),
                ESTIMATE_NOTE,
            ]
        )

    __str__ = summary

    def __repr__(self) -> str:
        p = self.plan
        return (
            f"<SimReport {p.machine.name}: {len(p.memory)} IPU(s), "
            f"{p.cycles:,} cycles per run (estimate)>"
        )

    def _target_line(self) -> str:
        m = self.plan.machine
        return (
            f"IPU memory (estimate, {m.name}: {m.tiles_per_ipu} tiles x "
            f"{fmt_bytes(m.bytes_per_tile)} = {fmt_bytes(m.bytes_per_ipu)} per IPU, "
            "per replica)"
        )

    def _memory_lines(self):
        live = self.plan.liveness
        for ipu, m in self.plan.memory.items():
            line = (
                f"  IPU {ipu}: variables {fmt_bytes(m.variables)}, constants "
                f"{fmt_bytes(m.constants)}, code {fmt_bytes(m.code)}, stream buffers "
                f"{fmt_bytes(m.streams)}, activations peak {fmt_bytes(m.activations)}; "
                f"total {fmt_bytes(m.total)} ({_fmt_percent(m.fraction)})"
            )
            if m.out_of_memory:
                line += f" OUT OF MEMORY by {fmt_bytes(m.total - m.capacity)}"
            if m.loaded_variables:
                line += (
                    f"; remote variables on chip at most {fmt_bytes(m.loaded_variables)} "
                    "(in the activations)"
                )
            step = live.peak_step.get(ipu)
            if step is not None and m.activations:
                line += f"; peak at step {step} ({live.steps[step]})"
            yield line

    def _time_line(self) -> str:
        p, c = self.plan, self.plan.work.cycles
        parts = [
            f"{name} {value:,}" for name, value in c.to_dict().items() if value and name != "total"
        ]
        split = f" ({', '.join(parts)})" if parts else ""
        return (
            f"Time per run (estimate): {c.total:,} cycles = {fmt_seconds(p.seconds)} at "
            f"{p.machine.clock_hz / 1e9:.2f} GHz{split}"
        )

    def _work_line(self) -> str:
        p, w = self.plan, self.plan.work
        ops = sum(g.ops for g in p.graphs)
        return (
            f"Work per run: {w.flops:,} FLOPs; host in {fmt_bytes(w.host_bytes_in)}, out "
            f"{fmt_bytes(w.host_bytes_out)} per replica; {ops} ops in {len(p.graphs)} graph(s)"
        )

    def _traffic_line(self) -> str:
        p, w = self.plan, self.plan.work
        return (
            f"Streaming Memory: {len(p.remote_buffers)} remote buffer(s), "
            f"{fmt_bytes(p.streaming_memory_bytes)}; per run loaded "
            f"{fmt_bytes(w.remote_bytes_loaded)}, stored {fmt_bytes(w.remote_bytes_stored)}; "
            f"IPU-Link {fmt_bytes(w.link_bytes)}"
        )

    def op_table(self, limit: int | None = 20) -> str:
        """The ops that cost most per run (cycles x executions), one line each."""
        rows = sorted(self.plan.ops, key=lambda r: -r.cycles * r.runs)[:limit]
        lines = [
            f"{'graph':<16} {'op':<24} {'ipu':>3} {'tiles':>5} {'runs':>5} "
            f"{'cycles/run':>11} {'FLOPs':>13} {'out bytes':>10} {'code':>9}"
        ]
        lines += [
            f"{r.graph[:16]:<16} {r.op[:24]:<24} {r.ipu:>3} {r.tiles:>5} {r.runs:>5} "
            f"{r.cycles * r.runs:>11,} {r.flops * r.runs:>13,} "
            f"{fmt_bytes(r.out_bytes):>10} {fmt_bytes(r.code_bytes):>9}"
            for r in rows
        ]
        return "\n".join(lines)

    def program_tree(self) -> str:
        """The program as nested calls and repeats, with transfers and collectives."""
        from .tree import program_tree, tree_text

        return tree_text(program_tree(self.plan))

    # liveness -------------------------------------------------------------------------
    def liveness(self, ipu: int = 0, expand: bool = True) -> list[tuple[str, int]]:
        """Not-always-live bytes on ``ipu`` at each step of the main graph as
        ``(op, bytes)``; with ``expand`` every call and repeat shows its callee's steps
        (paths like ``"Call.3/MatMul.1"``; one loop iteration)."""
        from .liveness import flat_curve

        p = self.plan
        if expand:
            return flat_curve(p.analysis, p.main, ipu)
        return [(op, step.get(ipu, 0)) for op, step in zip(p.liveness.steps, p.liveness.curve)]

    def loaded_variables(self, ipu: int = 0, expand: bool = True) -> list[tuple[str, int]]:
        """Bytes of remote variables' data on chip (loaded, gathered; part of the liveness)
        at each step, as ``(op, bytes)``. The curve is kept per step of the main graph; with
        ``expand`` every step inside a call or repeat shows its main-graph step's value (the
        most it holds during that call), aligned with ``liveness(ipu)``."""
        p = self.plan
        main = [c.get(ipu, 0) for c in p.loaded_variables.curve]
        if not expand:
            return list(zip(p.liveness.steps, main))
        index = {name: i for i, name in enumerate(p.liveness.steps)}
        return [(path, main[index[path.split("/")[0]]]) for path, _ in self.liveness(ipu)]

    def plot_liveness(self, path: str | Path, ipu: int = 0, title: str | None = None) -> Path:
        """Write the liveness curve of ``ipu`` as a PNG (needs matplotlib: extra ``plot``)."""
        from .plot import plot_liveness

        return plot_liveness(self, Path(path), ipu, title)

    def outlining(self):
        """Code bytes as compiled vs every ``Call`` inlined (`popxl_core.sim.outlining`)."""
        from .outlining import outlining

        return outlining(self.plan)

    def diff(self, other: SimReport, names: tuple[str, str] = ("this", "other")):
        """A `ReportDiff` of the key numbers of this report and ``other``."""
        from .report_diff import ReportDiff

        return ReportDiff(self, other, names)

    # data ---------------------------------------------------------------------------
    def totals(self) -> dict[str, Any]:
        """The headline numbers (sums over the IPUs of one replica where not per IPU)."""
        p, w = self.plan, self.plan.work
        mems = list(p.memory.values())
        return {
            "target": p.machine.name,
            "peak_bytes_per_ipu": [m.total for m in mems],
            "capacity_bytes_per_ipu": p.machine.bytes_per_ipu,
            "always_live_bytes": sum(m.always_live for m in mems),
            "not_always_live_peak_bytes": sum(m.activations for m in mems),
            "variable_bytes": sum(m.variables for m in mems),
            # remote variables' data loaded on chip at its peak, and with the always-live ones
            "loaded_variable_peak_bytes": sum(m.loaded_variables for m in mems),
            "variables_on_chip_peak_bytes": sum(m.variables_on_chip for m in mems),
            "constant_bytes": sum(m.constants for m in mems),
            "code_bytes": sum(m.code for m in mems),
            "stream_buffer_bytes": sum(m.streams for m in mems),
            "streaming_memory_bytes": p.streaming_memory_bytes,
            "estimated_cycles": p.cycles,
            "estimated_seconds": p.seconds,
            "flops": w.flops,
            "host_bytes_in": w.host_bytes_in,
            "host_bytes_out": w.host_bytes_out,
            "remote_bytes_loaded": w.remote_bytes_loaded,
            "remote_bytes_stored": w.remote_bytes_stored,
            "ipu_link_bytes": w.link_bytes,
            "ops": sum(g.ops for g in p.graphs),
            "graphs": len(p.graphs),
        }

    def to_dict(self) -> dict[str, Any]:
        """Everything as plain JSON-serialisable values (IPU keys are strings)."""
        from .tree import program_tree

        p = self.plan
        return self.totals() | {
            "estimate": True,
            "note": ESTIMATE_NOTE,
            "machine": _machine_dict(p.machine),
            "replication_factor": p.replication_factor,
            "memory": {str(i): _memory_dict(mem) for i, mem in p.memory.items()},
            "out_of_memory": list(p.out_of_memory),
            "remote_buffers": [vars(b) | {"shape": list(b.shape)} for b in p.remote_buffers],
            "cycles": p.work.cycles.to_dict(),
            "seconds": p.seconds,
            "graph_table": [g.row() for g in p.graphs],
            "outlining": self.outlining().to_dict(),
            "op_table": [vars(r).copy() for r in p.ops],
            "program_tree": program_tree(p),
            "liveness": [
                {"step": i, "op": op, "bytes": {str(k): v for k, v in b.items()}}
                for i, (op, b) in enumerate(zip(p.liveness.steps, p.liveness.curve))
            ],
            # calls and repeats expanded, per IPU: what plot_liveness draws
            "liveness_expanded": {
                str(i): [[op, b] for op, b in self.liveness(i)] for i in p.memory
            },
            # per main-graph step, per IPU: remote variables' data on chip
            "loaded_variables": {
                str(i): [b for _, b in self.loaded_variables(i, False)] for i in p.memory
            },
        }

    def to_json(self, path: str | Path | None = None, indent: int = 1) -> str:
        """`to_dict` as JSON text; also written to ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=indent)
        if path is not None:
            Path(path).write_text(text + "\n")
        return text


def _memory_dict(m) -> dict[str, Any]:
    return {
        "variables": m.variables,
        "constants": m.constants,
        "code": m.code,
        "streams": m.streams,
        "activations_peak": m.activations,
        "loaded_variables_peak": m.loaded_variables,
        "variables_on_chip_peak": m.variables_on_chip,
        "always_live": m.always_live,
        "total": m.total,
        "capacity": m.capacity,
        "fraction": m.fraction,
        "out_of_memory": m.out_of_memory,
        "top": [{"category": c, "name": n, "bytes": b} for c, n, b in m.top],
        "live_at_peak": [t._asdict() for t in m.live_top],
    }


def _machine_dict(m) -> dict[str, Any]:
    keys = ("name", "tiles_per_ipu", "bytes_per_tile", "bytes_per_ipu", "num_ipus", "clock_hz")
    return {k: getattr(m, k) for k in (*keys, "oom_is_error")}
