"""The Session's one-time plan: memory per IPU by category and cycles per run (estimates).

`build_plan` runs once, when a Session is built; nothing here runs per step. Memory follows
Poplar's split (ipu_model.md §3): always-live variables, constants, code and stream buffers,
plus the peak of the not-always-live tensors from a liveness analysis of the schedule.
Cycles follow the BSP model in `cost.py`.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from ..graph import Graph
from ..schedule import schedule
from .cost import CostModel, Work, nbytes_of
from .liveness import TOP_N, Liveness, LivenessAnalysis
from .machine import Machine
from .remote_plan import is_remote_variable, streaming_memory

__all__ = ["GraphInfo", "IpuMemory", "OpRow", "OutOfMemoryError", "Plan", "build_plan"]


class OutOfMemoryError(MemoryError):
    """The estimated memory of an IPU exceeds its capacity on a target where that is fatal.

    ``plan`` holds the full estimate; ``plan.report().summary()`` prints it.
    """

    def __init__(self, message: str, plan: Plan | None = None) -> None:
        super().__init__(message)
        self.plan = plan


@dataclass
class IpuMemory:
    """Estimated bytes on one IPU (of one replica), by category."""

    ipu: int
    capacity: int
    variables: int = 0
    constants: int = 0
    code: int = 0
    streams: int = 0
    activations: int = 0  # the not-always-live peak
    top: list[tuple[str, str, int]] = field(default_factory=list)  # (category, name, bytes)

    @property
    def always_live(self) -> int:
        return self.variables + self.constants + self.code + self.streams

    @property
    def total(self) -> int:
        return self.always_live + self.activations

    @property
    def fraction(self) -> float:
        return self.total / self.capacity

    @property
    def out_of_memory(self) -> bool:
        return self.total > self.capacity


@dataclass
class GraphInfo:
    """One graph that runs: its op count, code bytes and executions per Session.run."""

    name: str
    ops: int
    code_bytes: int
    runs: int


@dataclass
class OpRow:
    """One op instance: estimated work of one execution (callees included) and how often."""

    graph: str
    op: str
    ipu: int
    tiles: int
    flops: int
    cycles: int
    code_bytes: int
    runs: int


@dataclass
class Plan:
    """Memory per IPU and work per run, estimated once for a Session."""

    machine: Machine
    replication_factor: int
    memory: dict[int, IpuMemory]
    work: Work  # one Session.run on one replica (replicas run in parallel)
    graphs: list[GraphInfo]
    ops: list[OpRow]
    liveness: Liveness  # of the main graph
    _report: object = field(default=None, repr=False)

    @property
    def cycles(self) -> int:
        return self.work.cycles.total

    @property
    def seconds(self) -> float:
        return self.cycles / self.machine.clock_hz

    @property
    def out_of_memory(self) -> list[int]:
        """IPUs whose estimate exceeds their capacity."""
        return [i for i, m in self.memory.items() if m.out_of_memory]

    @property
    def variable_bytes(self) -> dict[int, int]:
        return {i: m.variables for i, m in self.memory.items()}

    def report(self):
        """The `SimReport` of this plan (built once)."""
        if self._report is None:
            from .report import SimReport

            self._report = SimReport(self)
        return self._report


def build_plan(ir, machine: Machine) -> Plan:
    """Plan ``ir`` on ``machine``; raises `OutOfMemoryError` if an IPU overflows and the
    target treats that as fatal (``machine.oom_is_error``)."""
    graphs = _reachable(ir.main_graph)
    opts = ir._pb_ir.getSessionOptions()
    ipus = 1 + max((op.ipu for g in graphs for op in g._ops), default=0)
    model = CostModel(machine, num_ipus=ipus * ir.replication_factor,
                      io_tiles=opts.numIOTiles, replicas=ir.replication_factor)
    liveness = LivenessAnalysis().of(ir.main_graph)
    runs = model.graph_runs(ir.main_graph)
    plan = Plan(machine, ir.replication_factor, _memory(ir, graphs, model, liveness),
                model.graph_work(ir.main_graph), _graph_infos(graphs, model, runs),
                _op_rows(graphs, model, runs), liveness)
    plan.streaming_memory = streaming_memory(ir)
    if plan.out_of_memory and machine.oom_is_error:
        raise OutOfMemoryError(_oom_message(plan, plan.out_of_memory[0]), plan)
    return plan


def _reachable(main: Graph) -> list[Graph]:
    """The main graph and every graph it calls, directly or not, in discovery order."""
    found: dict[Graph, None] = {main: None}
    stack = [main]
    while stack:
        for op in stack.pop()._ops:
            for g in op.called_graphs:
                if g not in found:
                    found[g] = None
                    stack.append(g)
    return list(found)


# memory -------------------------------------------------------------------------------
def _memory(ir, graphs: list[Graph], model: CostModel, live: Liveness) -> dict[int, IpuMemory]:
    cap = model.machine.bytes_per_ipu
    mem: dict[int, IpuMemory] = {}
    items: dict[int, list[tuple[str, str, int]]] = {}

    def add(ipu: int, category: str, name: str | None, nbytes: int) -> None:
        m = mem.get(ipu) or mem.setdefault(ipu, IpuMemory(ipu, cap))
        setattr(m, category, getattr(m, category) + nbytes)
        if name is not None:
            items.setdefault(ipu, []).append((category, name, nbytes))

    add(0, "variables", None, 0)  # IPU 0 is always reported
    for v in ir.main_graph.variables:
        if not is_remote_variable(v):  # Streaming Memory: see remote_plan
            add(v.ipu, "variables", v.id, nbytes_of(v))
    streams = set()
    for g in graphs:
        for c in g.constants:
            add(c.ipu, "constants", c.id, nbytes_of(c))
        for op in g._ops:
            add(op.ipu, "code", None, model.code_bytes(op))
            stream = op.attrs.get("stream") if op.type in ("HostLoad", "HostStore") else None
            if stream is not None and (stream, op.ipu) not in streams:
                streams.add((stream, op.ipu))
                add(op.ipu, "streams", stream.tensor_id, nbytes_of(stream))
    for ipu, nbytes in live.peak.items():
        add(ipu, "activations", None, nbytes)
        items.setdefault(ipu, []).extend(("activations", n, b) for n, b in live.top.get(ipu, []))
    for ipu, m in mem.items():
        if m.code:
            items.setdefault(ipu, []).append(("code", "all ops", m.code))
        m.top = heapq.nlargest(TOP_N, items.get(ipu, []), key=lambda x: x[2])
    return dict(sorted(mem.items()))


def _oom_message(plan: Plan, ipu: int) -> str:
    from .report import fmt_bytes

    m, mc, live = plan.memory[ipu], plan.machine, plan.liveness
    step = live.peak_step.get(ipu)
    where = "" if step is None else f" at main-graph step {step} ({live.steps[step]})"
    top = "; ".join(f"{cat.rstrip('s')} {name!r} {fmt_bytes(b)}" for cat, name, b in m.top)
    return (
        f"Out of memory on IPU {ipu} of {mc.name!r} (estimate): needs {fmt_bytes(m.total)}, "
        f"the IPU has {fmt_bytes(m.capacity)} ({mc.tiles_per_ipu} tiles x "
        f"{fmt_bytes(mc.bytes_per_tile)}).\n"
        f"  variables {fmt_bytes(m.variables)}, constants {fmt_bytes(m.constants)}, code "
        f"{fmt_bytes(m.code)}, stream buffers {fmt_bytes(m.streams)}, activations peak "
        f"{fmt_bytes(m.activations)}{where}.\n"
        f"  Biggest contributors: {top}.\n"
        "  Shrink the live tensors (smaller batch, recomputation, batch serialisation), shard or "
        "offload variables (replicated tensor sharding, remote variables), or use device "
        "'ipu_model', which reports OOM without stopping (see session.report). The full estimate "
        "is in this error's .plan.report()."
    )


# work ---------------------------------------------------------------------------------
def _graph_infos(graphs: list[Graph], model: CostModel,
                 runs: dict[Graph, int]) -> list[GraphInfo]:
    return [GraphInfo(g.name or "main", len(g._ops), sum(model.code_bytes(op) for op in g._ops),
                      runs.get(g, 0)) for g in graphs]


def _op_rows(graphs: list[Graph], model: CostModel, runs: dict[Graph, int]) -> list[OpRow]:
    rows = []
    for g in graphs:
        for op in schedule(g):
            w = model.op_work(op)
            rows.append(OpRow(g.name or "main", f"{op.type}.{op.id}", op.ipu, model.tiles_used(op),
                              w.flops, w.cycles.total, model.code_bytes(op), runs.get(g, 0)))
    return rows
