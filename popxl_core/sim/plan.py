"""The Session's one-time plan: memory per IPU by category and cycles per run (estimates).

`build_plan` runs once, when a Session is built; nothing here runs per step. Memory follows
Poplar's split (ipu_model.md §3): always-live variables, constants, code and stream buffers,
plus the peak of the not-always-live tensors from a liveness analysis of the schedule.
Cycles follow the BSP model in `cost.py`.
"""

from __future__ import annotations

import contextlib
import heapq
import warnings
from dataclasses import dataclass, field
from functools import cached_property
from math import prod
from typing import Callable, Iterator

from ..graph import Graph
from ..ops.io import HOST_LOAD, HOST_STORE
from ..schedule import schedule
from .cost import CostModel, Cycles, Work, nbytes_of
from .graphs import reachable_graphs
from .liveness import TOP_N, Liveness, LivenessAnalysis, LiveTensor
from .machine import Machine
from .oom import OutOfMemoryError, OutOfMemoryWarning, oom_message
from .remote_plan import is_remote_variable
from .variable_liveness import VariableCurve, VariableLiveness

__all__ = [
    "GraphInfo",
    "IpuMemory",
    "OpRow",
    "OutOfMemoryError",
    "OutOfMemoryWarning",
    "Plan",
    "RemoteBufferInfo",
    "build_plan",
    "observed_plans",
]

# The lists of the `observed_plans` contexts now open (innermost last).
_observers: list[list] = []


@contextlib.contextmanager
def observed_plans() -> Iterator[list]:
    """A list that receives every Session's Plan built inside the context, as it is built
    and before any OOM is raised (`python -m popxl_core.report` finds the Sessions a script
    builds so)."""
    plans: list = []
    _observers.append(plans)
    try:
        yield plans
    finally:
        _observers.remove(plans)


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
    # the peak of remote variables' data loaded on chip (part of ``activations``)
    loaded_variables: int = 0
    top: list[tuple[str, str, int]] = field(default_factory=list)  # (category, name, bytes)
    live_top: list[LiveTensor] = field(default_factory=list)  # largest tensors at the peak

    @property
    def always_live(self) -> int:
        return self.variables + self.constants + self.code + self.streams

    @property
    def total(self) -> int:
        return self.always_live + self.activations

    @property
    def variables_on_chip(self) -> int:
        """The most variable bytes on chip at once: always-live variables plus the peak of
        remote variables loaded (the largest phase's, for a phased program)."""
        return self.variables + self.loaded_variables

    @property
    def fraction(self) -> float:
        return self.total / self.capacity

    @property
    def out_of_memory(self) -> bool:
        return self.total > self.capacity


@dataclass
class GraphInfo:
    """One graph that runs: its op count, code bytes, executions per Session.run and the
    cycles of one execution (callees included; estimated when first read, `Plan`)."""

    name: str
    ops: int
    code_bytes: int
    runs: int
    estimate: Callable[[], int] | None = field(default=None, repr=False, compare=False)

    @property
    def cycles(self) -> int:
        return self.estimate() if self.estimate is not None else 0

    def row(self) -> dict:
        """The report's row of this graph."""
        return {k: getattr(self, k) for k in ("name", "ops", "code_bytes", "runs", "cycles")}


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
    out_bytes: int = 0  # bytes of the op's outputs (aliases included)
    module_path: str | None = None  # the torch module it came from (popxl_fx)


@dataclass
class RemoteBufferInfo:
    """One remote buffer in Streaming Memory: ``entries`` slots of one tensor shape."""

    id: int
    shape: tuple[int, ...]
    dtype: str
    entries: int
    nbytes: int


@dataclass
class Plan:
    """Memory per IPU and work per run, estimated once for a Session.

    The memory is planned when the Session is built (it decides out-of-memory). The work
    (``work``, each graph's ``cycles``, the per-op rows ``ops``) is estimated when first read,
    and kept: most Sessions never read it (the estimate was ~6 % of the test suite's CPU). A
    Session's Ir does not change after the Session is made, so the estimate is the same
    whenever it is made."""

    machine: Machine
    replication_factor: int
    memory: dict[int, IpuMemory]
    graphs: list[GraphInfo]
    liveness: Liveness  # of the main graph
    analysis: LivenessAnalysis = field(repr=False, default_factory=LivenessAnalysis)
    remote_buffers: list[RemoteBufferInfo] = field(default_factory=list)
    main: Graph | None = field(default=None, repr=False)
    loaded_variables: VariableCurve | None = field(default=None, repr=False)  # of the main graph
    model: CostModel | None = field(default=None, repr=False)  # for per-graph/op look-ups
    _report: object = field(default=None, repr=False)
    reachable: list[Graph] = field(default_factory=list, repr=False)  # the graphs that run
    runs: dict[Graph, int] = field(default_factory=dict, repr=False)  # executions per run

    @cached_property
    def work(self) -> Work:
        """One Session.run on one replica (replicas run in parallel)."""
        launch = Work(Cycles(launch=self.machine.run_overhead_cycles))
        assert self.model is not None and self.main is not None  # `build_plan` sets both
        return self.model.graph_work(self.main) + launch

    @cached_property
    def ops(self) -> list[OpRow]:
        """One row per op instance of the graphs that run."""
        assert self.model is not None  # `build_plan` sets it
        return _op_rows(self.reachable, self.model, self.runs)

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

    @property
    def streaming_memory_bytes(self) -> int:
        """Bytes of all remote buffers of one replica (0 when the program has none)."""
        return sum(b.nbytes for b in self.remote_buffers)

    def report(self):
        """The `SimReport` of this plan (built once)."""
        if self._report is None:
            from .report import SimReport

            self._report = SimReport(self)
        return self._report


def build_plan(ir, machine: Machine, observe: bool = True) -> Plan:
    """Plan ``ir`` on ``machine``; raises `OutOfMemoryError` if an IPU overflows and the
    target treats that as fatal (``machine.oom_is_error``), warns if ``machine.oom_warns``.
    ``observe=False`` keeps the plan from `observed_plans` (an estimate of a program under
    construction, e.g. popxl_fx's per-stage memory, is not a Session's plan)."""
    graphs, model, analysis, liveness, loaded = _analysed(ir, machine)
    runs = model.graph_runs(ir.main_graph)
    plan = Plan(
        machine,
        ir.replication_factor,
        _memory(ir, graphs, model, liveness, loaded),
        _graph_infos(graphs, model, runs),
        liveness,
        analysis,
        _remote_buffers(ir),
        ir.main_graph,
        loaded,
        model,
        reachable=graphs,
        runs=runs,
    )
    for plans in _observers if observe else ():
        plans.append(plan)
    _check_fits(plan, machine)
    return plan


def _analysed(ir, machine: Machine) -> tuple:
    """What a plan starts from: (graphs, cost model, liveness analysis, the main graph's
    liveness, its remote variables' curve)."""
    graphs = reachable_graphs(ir.main_graph)
    opts = ir._pb_ir.getSessionOptions()
    ipus = _num_ipus(graphs, machine)
    model = CostModel(
        machine,
        num_ipus=ipus * ir.replication_factor,
        io_tiles=opts.numIOTiles,
        replicas=ir.replication_factor,
    )
    analysis = LivenessAnalysis()
    liveness = analysis.of(ir.main_graph)
    loaded = VariableLiveness(ir, analysis).of(ir.main_graph)
    return graphs, model, analysis, liveness, loaded


def _check_fits(plan: Plan, machine: Machine) -> None:
    """Raise or warn, as ``machine`` says, when an IPU overflows."""
    if plan.out_of_memory and machine.oom_is_error:
        raise OutOfMemoryError(oom_message(plan, plan.out_of_memory[0]), plan)
    if plan.out_of_memory and machine.oom_warns:
        warnings.warn(
            oom_message(plan, plan.out_of_memory[0], fatal=False), OutOfMemoryWarning, stacklevel=4
        )


def _num_ipus(graphs: list[Graph], machine: Machine) -> int:
    """IPUs per replica: what the ops use, checked against the target's ``num_ipus``."""
    used = 1 + max((op.ipu for g in graphs for op in g._ops), default=0)
    if machine.num_ipus is not None and used > machine.num_ipus:
        op = next(op for g in graphs for op in g._ops if op.ipu >= machine.num_ipus)
        raise ValueError(
            f"Op {op.type}.{op.id} ({op.name!r}) in graph {op.graph.name or 'main'!r} is placed "
            f"on IPU {op.ipu}, but target {machine.name!r} has num_ipus={machine.num_ipus} per "
            "replica: raise num_ipus or place the op with popxl.ipu() on a lower IPU."
        )
    return machine.num_ipus or used


def _remote_buffers(ir) -> list[RemoteBufferInfo]:
    """Streaming-Memory buffers of the Ir (PopXL RemoteBuffer: tensor_shape x entries)."""
    found = []
    for key, buf in getattr(ir, "_remote_buffers", {}).items():
        shape = tuple(buf.tensor_shape)
        dtype = buf.tensor_dtype
        nbytes = prod(shape) * dtype.itemsize * buf.entries
        found.append(RemoteBufferInfo(key, shape, dtype.name, buf.entries, nbytes))
    return found


# memory -------------------------------------------------------------------------------
def _memory(
    ir, graphs: list[Graph], model: CostModel, live: Liveness, loaded: VariableCurve
) -> dict[int, IpuMemory]:
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
            stream = op.attrs.get("stream") if op.opdef in (HOST_LOAD, HOST_STORE) else None
            if stream is not None and (stream, op.ipu) not in streams:
                streams.add((stream, op.ipu))
                add(op.ipu, "streams", stream.tensor_id, nbytes_of(stream))
    for ipu, nbytes in live.peak.items():
        add(ipu, "activations", None, nbytes)
        items.setdefault(ipu, []).extend(
            ("activations", t.name, t.nbytes) for t in live.top.get(ipu, [])
        )
        mem[ipu].live_top = list(live.top.get(ipu, []))
    for ipu, nbytes in loaded.peak.items():
        add(ipu, "loaded_variables", None, nbytes)
    for ipu, m in mem.items():
        if m.code:
            items.setdefault(ipu, []).append(("code", "all ops", m.code))
        m.top = heapq.nlargest(TOP_N, items.get(ipu, []), key=lambda x: x[2])
    return dict(sorted(mem.items()))


# work ---------------------------------------------------------------------------------
def _graph_infos(graphs: list[Graph], model: CostModel, runs: dict[Graph, int]) -> list[GraphInfo]:
    return [
        GraphInfo(
            g.name or "main",
            len(g._ops),
            sum(model.code_bytes(op) for op in g._ops),
            runs.get(g, 0),
            _cycles_of(model, g),
        )
        for g in graphs
    ]


def _cycles_of(model: CostModel, graph: Graph) -> Callable[[], int]:
    """The cycles of one execution of ``graph``, estimated when asked (the model caches it)."""
    return lambda: model.graph_work(graph).cycles.total


def _op_rows(graphs: list[Graph], model: CostModel, runs: dict[Graph, int]) -> list[OpRow]:
    rows = []
    for g in graphs:
        for op in schedule(g):
            w = model.op_work(op)
            rows.append(
                OpRow(
                    g.name or "main",
                    f"{op.type}.{op.id}",
                    op.ipu,
                    model.tiles_used(op),
                    w.flops,
                    w.cycles.total,
                    model.code_bytes(op),
                    runs.get(g, 0),
                    sum(nbytes_of(t) for t in op.outputs),
                    op.module_path,
                )
            )
    return rows
