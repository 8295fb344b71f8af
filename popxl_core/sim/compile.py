"""Compile each graph of an Ir into one flat Python function over torch kernels.

Like torch.fx's code generation: the schedule is walked once, at Session construction,
and turned into straight-line source; per step the simulator only calls kernels.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Dict, List, Set, cast

import torch

from ..graph import Graph, Op
from ..host_data import host_to_torch
from ..ops.call import CALL, call_args
from ..remote_variables import remote_info
from ..schedule import schedule
from ..tensor import Constant, Tensor, Variable
from .alias import ViewOutputs
from .batching import emit_batched
from .call_outputs import kept_outputs
from .code_cache import compiled as compiled_code
from .conv_pairs import JointOps, conv_pair_kernel
from .defer import DEFER_NAME, deferred_at, emit_deferred
from .direct import direct_call
from .foreach import Group, group_kernel
from .fuse import transposed_kernel
from .handoff import HANDOFF_PARAM, emit_handoff_call, handoff_graph, unpack_lines
from .inductor import compile_pure_graphs
from .inductor_step import compile_step, step_options
from .inplace import inplace_kernel
from .kernel_wrappers import (
    cloning,
    fp16_in_fp32,
    fp16_via_fp32,
    spec_checked,
    touches_narrow_unsigned,
    unsigned_via_int64,
)
from .options import DEFAULT, CompileOptions
from .passes import STATS, GraphPlan, live_ops, run_passes
from .remote_views import view_loads
from .uniform import plan_sharing
from .variants import buffer_graphs, graphs_run_once, variant_kernel

__all__ = ["Program", "CompiledGraph", "Emitter"]


class CompiledGraph:
    """One graph's generated function and its source (for debugging)."""

    def __init__(self, graph: Graph, fn: Callable, source: str) -> None:
        self.graph = graph
        self.fn = fn
        self.source = source
        self.plan: Any = None  # the `GraphPlan` it was emitted from


class Emitter:
    """Code generation state for one graph; custom `OpDef.emit` functions use it."""

    def __init__(self, program: "Program", graph: Graph) -> None:
        self.program = program
        self.graph = graph
        self.lines: List[str] = []
        self.names: Dict[Tensor, str] = {}
        self.modifying = _has_modifying_ops(graph)
        self.read: Set[Tensor] = set()  # tensors a live op or the graph's outputs read

    def name(self, t: Tensor) -> str:
        if t not in self.names:
            if isinstance(t, Constant):
                self.names[t] = self.program.add_global("c", host_to_torch(t._data.copy()))
            else:
                self.names[t] = f"v{len(self.names)}"
        return self.names[t]

    def bind_global(self, prefix: str, value: Any) -> str:
        return self.program.add_global(prefix, value)

    def emit(self, line: str) -> None:
        self.lines.append(line)

    def emit_call(self, prefix: str, fn: Callable, op: Op) -> str:
        """``outs = fn(ins)`` for ``op``: ``fn`` a global of the generated code recorded as
        ``op``'s (errors name it); returns the global's name."""
        k = self.bind_global(prefix, fn)
        self.program.kernel_ops[k] = op
        ins = ", ".join(self.name(t) for t in op.inputs)
        outs = ", ".join(self.name(t) for t in op.outputs)
        self.emit(f"{outs} = {k}({ins})" if outs else f"{k}({ins})")
        return k

    def graph_fn(self, g: Graph) -> str:
        """The global name of the compiled function of subgraph ``g``."""
        return self.program.fn_name(g)


class Program:
    """All graphs of an Ir compiled to Python functions sharing one namespace, with the
    passes `options` switches on (`passes.PASSES`)."""

    def __init__(self, ir, runtime: Any, options: CompileOptions = DEFAULT, fold=None) -> None:
        self.ir = ir
        self.options = step_options(ir, options)  # the fast mode's whole step: its passes
        self.fold = fold  # `fold.FoldPlan`: all replicas' step in one run (fold.py), or None
        # how often each optimisation applied (tests check that the fused paths ran)
        self.stats: Dict[str, int] = dict.fromkeys(STATS, 0)
        self.namespace: Dict[str, Any] = {"RT": runtime, "torch": torch}
        self._counter = 0
        self._fn_names: Dict[Graph, str] = {}
        self.graphs: Dict[Graph, CompiledGraph] = {}
        self.kernel_ops: Dict[str, Op] = {}  # kernel global -> op, to name a failing op
        self.namespace["__popxl_kernel_ops__"] = self.kernel_ops  # `checks.running_op` reads it
        # the last run's dead gradients, freed when the next run starts (defer.py)
        self.deferred: List[Any] = []
        self.namespace[DEFER_NAME] = self.deferred
        self.modified_inputs: Dict[Graph, Set[int]] = {}
        self.view_outputs = ViewOutputs(ir)
        self.once = graphs_run_once(ir)  # graphs that run at most once per Session.run
        self.once_per_replica = graphs_run_once(ir, per_replica=True)  # ... by each replica
        # ... whose ops may keep output buffers between runs (none when phased)
        self.keeps_buffers = buffer_graphs(ir, self.once_per_replica)
        self.view_loads: Set[Op] = set()  # main-graph remote loads made views (remote_views.py)
        # subgraph outputs no call site reads are not computed (call_outputs.py)
        self.kept_outputs = kept_outputs(ir.main_graph, live_ops)
        self.main = self._compile(ir.main_graph, is_main=True)
        # replicas: the main graph without the work done once for all (uniform.py), or None
        self.sharing = plan_sharing(self, self.main_plan)
        # the fast mode: the whole step as one torch.compile where it can be, else per graph
        if options.inductor and not compile_step(self):
            compile_pure_graphs(self)

    @property
    def check_specs(self) -> bool:
        return self.options.check_specs

    def graphs_used(self) -> List[Graph]:
        """The main graph and every graph compiled for it."""
        return [self.ir.main_graph, *self.graphs]

    def add_global(self, prefix: str, value: Any) -> str:
        self._counter += 1
        name = f"{prefix}{self._counter}"
        self.namespace[name] = value
        return name

    def fn_name(self, g: Graph) -> str:
        if g not in self._fn_names:
            self._fn_names[g] = f"graph_{len(self._fn_names)}"
            self.graphs[g] = self._compile(g, is_main=False)
        return self._fn_names[g]

    def compile_follower(self, skipped) -> tuple:
        """The main graph without the ops ``skipped`` (run by the first replica only,
        uniform.py): its function and plan; its pass statistics are not counted."""
        stats: Dict[str, int] = dict.fromkeys(STATS, 0)
        compiled = self._compile(self.ir.main_graph, True, skipped, "main_follow", stats)
        return compiled.fn, compiled.plan

    def _compile(
        self, g: Graph, is_main: bool, skipped=frozenset(), fname: str = "", stats=None
    ) -> CompiledGraph:
        """Plan ``g`` (dead ops, then the passes), emit its ops, define its function."""
        em = Emitter(self, g)
        params = self._main_params(em) if is_main else [em.name(t) for t in g._inputs]
        if handoff_graph(self, g):
            em.lines.extend(unpack_lines(params))
            params = [HANDOFF_PARAM]
        stats = self.stats if stats is None else stats
        options = self.options
        if self.fold is not None and g in self.fold.graphs:  # its ops are emitted one by one
            options = dataclasses.replace(options, foreach=False)
        plan = run_passes(self._plan(g, skipped, stats), options, stats)
        if is_main and not skipped:
            self.main_plan = plan
            if g.ir.replication_factor == 1:  # replicas' entries are theirs alone: not shared
                self.view_loads = view_loads(plan)
        em.read = _read_tensors(plan.live, plan.returned)
        _emit_ops(plan, em)
        fname = fname or ("main" if is_main else self._fn_names.get(g, f"graph_{id(g)}"))
        source = _source(fname, params, em, self.kept_outputs.get(g))
        self.namespace.setdefault("__popxl_sources__", {})[fname] = source
        exec(compiled_code(source, f"<popxl graph {g.name or 'main'}>"), self.namespace)
        self.modified_inputs[g] = _modified_graph_inputs(g)
        compiled = CompiledGraph(g, self.namespace[fname], source)
        compiled.plan = plan
        return compiled

    def _main_params(self, em: Emitter) -> List[str]:
        """The main function takes the variables' values as one list ``V`` (every caller
        passes one value per variable), unpacked in one line: a line per variable made the
        largest part of a big main graph's source, which Python parses at every build; remote
        variables live in Streaming Memory, not in the on-chip state."""
        self.variables: List[Variable] = [v for v in em.graph.variables if not is_remote(v)]
        if self.variables:
            em.emit(f"{', '.join(em.name(v) for v in self.variables)}, = V")
        return ["V"]

    def _plan(self, g: Graph, skipped, stats: Dict[str, int]) -> GraphPlan:
        """``g``'s live schedule: the outputs some caller reads and the ops they need, less
        the ``skipped`` ones."""
        kept = self.kept_outputs.get(g)
        returned = [t for i, t in enumerate(g._outputs) if kept is None or i in kept]
        stats["unread_graph_outputs"] += len(g._outputs) - len(returned)
        live = [op for op in live_ops(g, returned) if op not in skipped]
        return GraphPlan(g, returned, live)


def is_remote(v: Variable) -> bool:
    return remote_info(v) is not None


def _read_tensors(live: List[Op], outputs: List[Tensor]) -> Set[Tensor]:
    read = set(outputs)
    for op in live:
        read.update(op.inputs)
    return read


def _source(fname: str, params: List[str], em: Emitter, kept) -> str:
    """The graph's function: its emitted lines, returning the kept outputs (None for the
    others)."""
    outs = ", ".join(
        em.name(t) if kept is None or i in kept else "None" for i, t in enumerate(em.graph._outputs)
    )
    body = "\n    ".join(em.lines) or "pass"
    ret = f"({outs},)" if outs else "()"
    return f"def {fname}({', '.join(params)}):\n    {body}\n    return {ret}\n"


def _emit_ops(plan: GraphPlan, em: Emitter) -> None:
    """Each live op's code (a group's at its first op, a fused pair's at the op emitted),
    then ``del`` of the temporaries no later op reads."""
    first = {grp.ops[0]: grp for grp in plan.groups}
    skip = plan.skipped()
    deferred = _deferred(plan, first, em)
    for k, op in enumerate(plan.live):
        handed: Set[Tensor] = set()  # arguments whose last reader is a handoff call
        if op in first:
            _emit_group(first[op], em)
        elif _handed_over(op, em.program):
            handed = _emit_handoff(op, plan.released.get(k, ()), em)
        elif op not in skip:
            _emit_op(op, plan, em)
        dead = [em.names[t] for t in plan.released.get(k, ()) if t in em.names and t not in handed]
        later = [em.names[t] for t in deferred.get(k, ()) if t in em.names and t not in handed]
        emit_deferred(later, em)
        if dead:  # drop the last reference: the allocator recycles the storage now
            em.emit(f"del {', '.join(dead)}")


def _deferred(plan: GraphPlan, first: Dict[Op, Group], em: Emitter) -> Dict[int, Set[Tensor]]:
    """The update's dead inputs to free at the next run's start (defer.py), in a graph that
    runs once per run."""
    program = em.program
    if not program.options.defer_release or em.graph not in program.once_per_replica:
        return {}
    emitted = {k: first[op].ops for k, op in enumerate(plan.live) if op in first}
    return deferred_at(plan.live, plan.released, emitted)


def _handed_over(op: Op, program: Program) -> bool:
    return op.opdef is CALL and handoff_graph(program, op.called_graphs[0])


def _emit_handoff(op: Op, released, em: Emitter) -> Set[Tensor]:
    """The call with its arguments handed over (handoff.py); returns the arguments whose
    names it deleted."""
    em.graph_fn(op.called_graphs[0])  # compiled first: its modified inputs
    last = [t for t in released if t in op.inputs and t in em.names]
    emit_handoff_call(op, call_args(op, em), [em.names[t] for t in last], em)
    return set(last)


def _emit_op(op: Op, plan: GraphPlan, em: Emitter) -> None:
    if emit_batched(op, plan, em, _emit_kernel, _bound_kernel):  # replicas' batched sites
        return
    if op in plan.fused:
        _emit_transposed_matmul(op, plan.fused[op], em)
    elif op in plan.pairs:
        _emit_conv_pair(plan.pairs[op], em)
    elif op in plan.reuse:
        _emit_into(op, plan.reuse[op], em)
    else:
        (op.opdef.emit or _emit_kernel)(op, em)


def _emit_kernel(op: Op, em: Emitter) -> None:
    """Default emission: ``outs = kernel(ins)`` with the op's attributes bound; the torch
    call itself for the ops `direct.py` lists."""
    if em.program.options.runs("direct", per_op=True):
        if not (op.opdef.view and _view_needs_copy(op, em)):
            call = direct_call(op, em.name, lambda v: em.bind_global("a", v))
            if call is not None:
                em.emit(f"{em.name(op.outputs[0])} = {call}")
                return
    em.emit_call("k", _bound_kernel(op, em), op)


def _emit_transposed_matmul(op: Op, mm: Op, em: Emitter) -> None:
    k = _bind_kernel(em, transposed_kernel(mm, em.program.ir.numerics), mm, checked=op)
    em.emit(f"{em.name(op.outputs[0])} = {k}({em.name(mm.inputs[0])}, {em.name(mm.inputs[1])})")


def _emit_conv_pair(ops: JointOps, em: Emitter) -> None:
    data, weight, bias = ops
    k = _bind_kernel(em, conv_pair_kernel(ops), weight)
    w = data.inputs[1] if data is not None else cast(Op, bias).inputs[2]
    args = ", ".join(em.name(t) for t in (weight.inputs[0], weight.inputs[1], w))
    outs = ", ".join(em.name(op.outputs[0]) if op is not None else "_" for op in ops)
    em.emit(f"{outs} = {k}({args})")


def _emit_into(op: Op, storage: Tensor, em: Emitter) -> None:
    k = _bind_kernel(em, inplace_kernel(op), op, checked=op)
    ins = ", ".join(em.name(t) for t in (*op.inputs, storage))
    em.emit(f"{em.name(op.outputs[0])} = {k}({ins})")


def _emit_group(grp: Group, em: Emitter) -> None:
    k = _bind_kernel(em, group_kernel(grp), grp.ops[0])
    ins = ", ".join(em.name(t) for op in grp.ops for t in op.inputs)
    outs = ", ".join(em.name(op.outputs[0]) for op in grp.ops)
    em.emit(f"{outs}, = {k}({ins})")


def _bind_kernel(em: Emitter, kernel: Callable, op: Op, checked: Op | None = None) -> str:
    """``kernel`` as a global of the generated code, recorded as ``op``'s (errors name it);
    wrapped to check ``checked``'s output specs when the program checks them."""
    if checked is not None and em.program.check_specs:
        kernel = spec_checked(kernel, checked)
    k = em.bind_global("k", kernel)
    em.program.kernel_ops[k] = op
    return k


def _bound_kernel(op: Op, em: Emitter) -> Callable:
    opdef = op.opdef
    sizes = [t.nelms for t in op.inputs]
    base = variant_kernel(op, em) or opdef.kernel_for(em.program.ir.numerics, sizes)
    if base is None:
        raise RuntimeError(f"{op.type}.{op.id} has no kernel and no emitter in the op table.")
    attrs = op.kernel_attrs()
    kernel = functools.partial(base, **attrs) if attrs else base
    if fp16_in_fp32(op):
        kernel = fp16_via_fp32(kernel, op)
    if not opdef.view and touches_narrow_unsigned(op):
        kernel = unsigned_via_int64(kernel, op)
    if opdef.view and _view_needs_copy(op, em):
        kernel = cloning(kernel)
    if em.program.check_specs:
        kernel = spec_checked(kernel, op)
    return kernel


def _view_needs_copy(op: Op, em: Emitter) -> bool:
    """A view is copied in a graph that writes in place, and when returned where an alias
    could be observed (`alias.ViewOutputs`)."""
    if em.modifying:
        return True
    views = em.program.view_outputs
    outs = [t for t in op.outputs if views.is_output(em.graph, t)]
    return any(views.needs_copy(em.graph, t) for t in outs)


def _has_modifying_ops(g: Graph) -> bool:
    return any(op.modified_inputs() for op in g._ops)


def _modified_graph_inputs(g: Graph) -> Set[int]:
    """Indexes of ``g``'s non-by-ref inputs that ``g`` writes: every call site (call, repeat,
    conditional) passes copies of these, and by-ref inputs are written in the caller."""
    alias = {t: t for t in g._inputs}
    for op in schedule(g):
        if op.opdef.inplace and op.outputs:
            src = op.inputs[op.opdef.inplace[0]]
            if src in alias:
                alias[op.outputs[0]] = alias[src]
    written = {
        alias[op.inputs[i]] for op in g._ops for i in op.modified_inputs() if op.inputs[i] in alias
    }
    return {i for i, t in enumerate(g._inputs) if t in written and t not in g._by_ref_inputs}
