"""The compiler's passes over one graph's scheduled op list.

`compile.Program` schedules each graph, drops dead ops, then runs `PASSES` in order on a
`GraphPlan`; the emitter reads the plan. Each pass is a small function with its switch (a
`CompileOptions` field) and the `Program.stats` counters it adds to (tests check that the
fused paths ran). Each keeps the bits of the reference interpreter (tests compare, switch by
switch); the rewrites know ops only through their `OpDef` fields (`popxl_core.ops.forms`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Set, Tuple

from ..graph import Graph, Op
from ..schedule import schedule
from ..tensor import Tensor
from .conv_pairs import JointOps, conv_backward_pairs, joined
from .foreach import Group, foreach_schedule, plan_modes
from .fuse import transposed_matmuls
from .inplace import reusable_in, reuse_plan
from .options import CompileOptions
from .release import release_points

__all__ = ["GraphPlan", "PASSES", "Pass", "STATS", "live_ops", "run_passes"]


@dataclass
class GraphPlan:
    """What the passes decide for one graph; the emitter reads it."""

    graph: Graph
    returned: List[Tensor]  # the graph outputs it computes (call_outputs.py)
    live: List[Op]  # the schedule without dead ops, reordered by the passes
    fused: Dict[Op, Op] = field(default_factory=dict)  # transpose -> the matmul it computes
    groups: List[Group] = field(default_factory=list)  # multi-tensor kernels
    pairs: Dict[Op, JointOps] = field(default_factory=dict)  # first -> (data, weight, bias)
    reuse: Dict[Op, Tensor] = field(default_factory=dict)  # op -> storage it writes into
    released: Dict[int, List[Tensor]] = field(default_factory=dict)  # index -> names to del

    def computed_at(self) -> Dict[Op, Op]:
        """Each op a fused kernel computes at another op's site -> that site's op."""
        at = {mm: transpose for transpose, mm in self.fused.items()}
        for first, ops in self.pairs.items():
            at.update((op, first) for op in joined(ops) if op is not first)
        return at

    def skipped(self) -> Set[Op]:
        """Ops computed by a fused kernel or a group emitted at another op."""
        skip = set(self.computed_at())
        skip.update(op for grp in self.groups for op in grp.ops[1:])
        return skip


def live_ops(g: Graph, outputs: List[Tensor]) -> List[Op]:
    """The schedule without dead ops: no side effect, no writes, no output that is used
    (``outputs``: the graph outputs it returns)."""
    used = set(outputs)
    live: List[Op] = []
    for op in reversed(schedule(g)):
        keep = (
            op.opdef.side_effect
            or op.modified_inputs()
            or op.called_graphs
            or any(t in used for t in op.outputs)
        )
        if keep:
            live.append(op)
            if not op.opdef.ignores_inputs:
                used.update(op.inputs)
    return live[::-1]


# the passes, in the order they run ---------------------------------------------------
def fuse_transposes(plan: GraphPlan, options: CompileOptions, stats: Dict[str, int]) -> None:
    """A matrix transpose of a matmul's result computed by one kernel (fuse.py)."""
    plan.fused = transposed_matmuls(plan.live, plan.graph)
    stats["transposed_matmuls"] += len(plan.fused)


def foreach_groups(plan: GraphPlan, options: CompileOptions, stats: Dict[str, int]) -> None:
    """Same-kind ops of many tensors made adjacent, to run as one multi-tensor kernel
    (foreach.py); their mode is decided by `out_reuse`, on the final order."""
    reusable = None if options.foreach_fresh else reusable_in(plan.live, plan.graph)
    plan.live, plan.groups = foreach_schedule(plan.live, reusable)


def conv_pairs(plan: GraphPlan, options: CompileOptions, stats: Dict[str, int]) -> None:
    """A convolution's data and weight gradients in one call (conv_pairs.py)."""
    plan.live, plan.pairs = conv_backward_pairs(plan.live)
    stats["conv_pairs"] += len(plan.pairs)


def out_reuse(plan: GraphPlan, options: CompileOptions, stats: Dict[str, int]) -> None:
    """Each group's mode and each op's ``out=`` storage, on the final order (foreach.py,
    inplace.py); counts the groups kept, per kind too (e.g. "foreach_LerpInplace")."""
    reusable = reusable_in(plan.live, plan.graph)
    fixed, plan.groups = plan_modes(plan.groups, plan.live, reusable, options.foreach_fresh)
    plan.reuse = reuse_plan(plan.live, plan.graph, fixed)
    stats["out_reuse"] += len(plan.reuse)  # single ops and grouped ones
    stats["foreach_groups"] += len(plan.groups)
    for grp in plan.groups:
        stats["foreach_ops"] += len(grp.ops)
        kind = f"foreach_{grp.ops[0].type}"
        stats[kind] = stats.get(kind, 0) + len(grp.ops)


def release(plan: GraphPlan, options: CompileOptions, stats: Dict[str, int]) -> None:
    """``del`` each temporary after its last reader (release.py)."""
    computed_at = plan.computed_at()
    plan.released = release_points(plan.live, plan.groups, computed_at, plan.reuse, plan.graph)


@dataclass(frozen=True)
class Pass:
    """A pass, its `CompileOptions` switch ("": always runs), whether spec checks turn it
    off (it replaces per-op kernels) and the stats it counts."""

    run: Callable[[GraphPlan, CompileOptions, Dict[str, int]], None]
    switch: str = ""
    per_op: bool = False
    stats: Tuple[str, ...] = ()


PASSES: Tuple[Pass, ...] = (
    Pass(fuse_transposes, "transposed_matmuls", stats=("transposed_matmuls",)),
    Pass(foreach_groups, "foreach"),
    Pass(conv_pairs, "conv_pairs", per_op=True, stats=("conv_pairs",)),
    Pass(out_reuse, stats=("out_reuse", "foreach_groups", "foreach_ops")),
    Pass(release, "release"),
)
# counted where the program is emitted: kernels skipping dead outputs or keeping buffers
# (variants.py), subgraph outputs no caller reads (call_outputs.py)
_EMIT_STATS = (
    "dead_outputs",
    "buffered_ops",
    "unread_graph_outputs",
    "stacked_ops",
    "folded_ops",
    "exact_folded_ops",
)
STATS: Tuple[str, ...] = (*(s for p in PASSES for s in p.stats), *_EMIT_STATS)


def run_passes(plan: GraphPlan, options: CompileOptions, stats: Dict[str, int]) -> GraphPlan:
    """Run every pass `options` switches on over ``plan``, in order."""
    for p in PASSES:
        if options.runs(p.switch, p.per_op):
            p.run(plan, options, stats)
    return plan
