"""`PhasedReport`: the simulator's report of a phased training step, phase by phase.

``trainer.report()`` of an ``Options(phased_execution=...)`` program. Every number is the
simulator's estimate (the `SimReport` it wraps); on top of it this report splits the main
graph's schedule into the phases' stretches (`PhaseSteps`, recorded by `popxl_fx.phased` as it
builds each piece's forward and, in reverse, its backward, optimizer update and stores) and
gives per phase:

    peak          the most the IPU holds while the phase runs (always-live bytes + the
                  liveness curve's maximum over its steps): the phase that sets the program's
                  peak is the one to split or shard
    loaded        of that, remote variables' data on chip (its weights, loaded or gathered,
                  and its optimizer state during the update)
    SM in / out   Streaming Memory bytes loaded / stored per step (per replica: with RTS the
                  shards)
    cycles        estimated cycles of its steps and the graphs they call (host streams,
                  counted in the step, left out), and the share of them spent in the remote
                  transfer ops (their syncs included)

and for the step the Streaming Memory traffic and the transfers' share of the estimated step
time. ``diff`` (and `SimReport.diff` given this report) compares the headline numbers with
another compile, e.g. the unphased one; everything else is the wrapped `SimReport`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from popxl_core.sim.cost import nbytes_of
from popxl_core.sim.report import SimReport, fmt_bytes, fmt_seconds

__all__ = ["PhaseRow", "PhaseSteps", "PhasedReport"]

_TRANSFERS = ("RemoteLoad", "RemoteStore")
# host streams (inputs, the optimizer's hyper-parameters) belong to the step, not a phase
_HOST = ("HostLoad", "HostStore", "Init")


@dataclass
class PhaseSteps:
    """The main-graph ops one piece of a phased step added: its forward, then its backward
    with the optimizer update and the stores."""

    label: str
    phase: bool
    forward: list = field(default_factory=list)
    backward: list = field(default_factory=list)


@dataclass(frozen=True)
class PhaseRow:
    """One piece's share of the step (bytes per IPU of one replica; see the module doc)."""

    label: str
    phase: bool
    peak: int
    loaded: int
    sm_loaded: int
    sm_stored: int
    cycles: int
    remote_cycles: int


def _op_name(op) -> str:
    return f"{op.type}.{op.id}"


def _called(ops) -> set[str]:
    """Names of every graph the ops call, nested calls included."""
    seen: set[str] = set()
    stack = [g for op in ops for g in op.called_graphs]
    while stack:
        g = stack.pop()
        if g.id not in seen:
            seen.add(g.id)
            stack += [c for op in g.ops for c in op.called_graphs]
    return seen


def _transfer_bytes(ops, kind: str) -> int:
    if kind == "RemoteLoad":
        return sum(nbytes_of(op.outputs[0]) for op in ops if op.type == kind)
    return sum(nbytes_of(op.inputs[0]) for op in ops if op.type == kind)


def phase_row(plan, steps: PhaseSteps, ipu: int = 0) -> PhaseRow:
    """The `PhaseRow` of ``steps`` in ``plan`` (the simulator's `Plan`)."""
    ops = steps.forward + steps.backward
    names = {_op_name(op) for op in ops}
    index = [i for i, s in enumerate(plan.liveness.steps) if s in names]
    curve = [plan.liveness.curve[i].get(ipu, 0) for i in index]
    loaded = [plan.loaded_variables.curve[i].get(ipu, 0) for i in index]
    graphs = _called(ops)
    rows = [
        r
        for r in plan.ops
        if r.ipu == ipu
        and (r.graph in graphs or (r.graph == "main" and r.op in names))
        and r.op.split(".")[0] not in _HOST
    ]
    return PhaseRow(
        label=steps.label,
        phase=steps.phase,
        peak=plan.memory[ipu].always_live + max(curve, default=0),
        loaded=max(loaded, default=0),
        sm_loaded=_transfer_bytes(ops, "RemoteLoad"),
        sm_stored=_transfer_bytes(ops, "RemoteStore"),
        cycles=sum(r.cycles * r.runs for r in rows),
        remote_cycles=sum(r.cycles * r.runs for r in rows if r.op.split(".")[0] in _TRANSFERS),
    )


class PhasedReport:
    """A `SimReport` with the phases' rows (`rows`); unknown attributes are the SimReport's."""

    def __init__(self, sim: SimReport, steps: list[PhaseSteps]) -> None:
        self.sim = sim
        self.rows = [phase_row(sim.plan, s) for s in steps]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["sim"], name)

    def diff(self, other, names: tuple[str, str] = ("this", "other")):
        """A `ReportDiff` of this report's headline numbers and ``other``'s."""
        return self.sim.diff(getattr(other, "sim", other), names)

    def transfer_share(self) -> float:
        """Share of the estimated step time spent on Streaming Memory transfers."""
        cycles = self.sim.plan.work.cycles
        return cycles.remote / cycles.total if cycles.total else 0.0

    def phase_table(self) -> str:
        """One line per piece: peak, loaded variables, Streaming Memory traffic, cycles."""
        width = max([len(r.label) for r in self.rows] + [5])
        head = (
            f"  {'phase':<{width}}  {'peak':>10}  {'loaded':>10}  {'SM in':>10}  "
            f"{'SM out':>10}  {'cycles':>12}  {'transfers':>9}"
        )
        lines = [head]
        top = max(self.rows, key=lambda r: r.peak) if self.rows else None
        for r in self.rows:
            share = f"{100 * r.remote_cycles / r.cycles:.0f}%" if r.cycles else "-"
            lines.append(
                f"  {r.label:<{width}}  {fmt_bytes(r.peak):>10}  {fmt_bytes(r.loaded):>10}  "
                f"{fmt_bytes(r.sm_loaded):>10}  {fmt_bytes(r.sm_stored):>10}  "
                f"{r.cycles:>12,}  {share:>9}" + ("  <- peak" if r is top else "")
            )
        return "\n".join(lines)

    def step_line(self) -> str:
        """Streaming Memory traffic per step and the estimated step time's transfer share."""
        p, w = self.sim.plan, self.sim.plan.work
        return (
            f"Per step: Streaming Memory loaded {fmt_bytes(w.remote_bytes_loaded)}, stored "
            f"{fmt_bytes(w.remote_bytes_stored)}; estimated {p.cycles:,} cycles = "
            f"{fmt_seconds(p.seconds)}, of which remote transfers {w.cycles.remote:,} cycles "
            f"({100 * self.transfer_share():.1f}%)"
        )

    def summary(self) -> str:
        """The phase table and step line, then the SimReport's summary."""
        n = sum(r.phase for r in self.rows)
        title = (
            f"Phased execution: {n} phases and {len(self.rows) - n} glue pieces "
            "(per IPU of one replica, estimates):"
        )
        return "\n".join([title, self.phase_table(), self.step_line(), self.sim.summary()])

    __str__ = summary

    def to_dict(self) -> dict[str, Any]:
        """The SimReport's dict with ``phases`` (one dict per row) and ``transfer_share``."""
        rows = [vars(r).copy() for r in self.rows]
        return self.sim.to_dict() | {"phases": rows, "transfer_share": self.transfer_share()}
