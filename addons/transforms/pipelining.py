"""`pipelined_execution`: a pipeline over stages on several IPUs (popxl.addons).

Inside ``with pipelined_execution(steps) as p:`` every op is created in a ``with p.stage(i):``
block (stages in order 0, 1, ...; usually each under ``popxl.ipu(k)`` with ``copy_to_ipu``
between them). On exit the stage ops become templates: the pipeline schedule replaces them,
where time step ``t`` runs (a copy of) stage ``j`` on micro-batch ``t - j``: a ramp-up
(stages 0..t), a main phase (every stage; one ``ops.repeat`` whose body spans the IPUs) and
a ramp-down, ``steps + stages - 1`` time steps in all.

A tensor that stage ``a`` makes for stage ``b > a`` waits ``b - a`` time steps in a stash:
``b - a + 1`` buffers on the consumer's IPU, shifted once per time step, which the planner
counts in that IPU's memory. Every micro-batch meets the same ops in the same order as the
unpipelined loop, so the numbers equal running the stages one micro-batch at a time
(``tests/test_addons_pipelining.py``); what the pipeline changes is where things live and
when they run. `stash_and_restore_tensor` and `stash_and_restore_activations` name the
tensors that cross stages, as in popxl.addons; every crossing tensor is stashed this way.

popxl.addons calls one subgraph per stage and time step inside ``popxl.in_sequence()``. Here
each stage's copy in a time step, and each stash shift, is a block that runs after the blocks
before it wherever they share storage (`popxl_core.block_order`), so PopXL's inplacing
ambiguity check accepts the schedule; inside a block only the user's own order counts (the
user's ``in_sequence`` in a stage is copied), so an ambiguity of the user's is still refused.
"""

from __future__ import annotations

import contextlib
from typing import Dict, Iterator, List, Optional, Tuple

import popxl_core
from popxl_core import Tensor, ops
from popxl_core.block_order import add_constraints, constraints_among, order_blocks
from popxl_core.context import get_current_context
from popxl_core.graph_edit import remove_ops
from popxl_core.ops.registry import create_op
from popxl_core.transforms.ipu_concurrency import concurrent_ipus

__all__ = ["pipelined_execution", "StageContext"]


class StageContext:
    """What ``pipelined_execution`` yields: ``stage(i)`` blocks and the stash helpers."""

    def __init__(self, graph: popxl_core.Graph, steps: int) -> None:
        self.graph, self.steps = graph, steps
        self.stages: Dict[int, List] = {}
        self.current: Optional[int] = None
        self.outside: List = []  # ops created in no stage (an error at exit)

    @contextlib.contextmanager
    def stage(self, index: int) -> Iterator[None]:
        """Ops created inside belong to stage ``index`` (stages are entered in order)."""
        if not isinstance(index, int) or index < 0:
            raise ValueError(f"pipeline stage must be a non-negative int, got {index!r}.")
        if self.current is not None:
            raise RuntimeError(f"pipeline stage {index} opened inside stage {self.current}.")
        last = max(self.stages, default=-1)
        if index < last:
            raise RuntimeError(
                f"pipeline stage {index} opened after stage {last}: create the stages in "
                "order (0, 1, ...), each in one block or in blocks that follow each other."
            )
        self.stages.setdefault(index, [])
        self.current = index
        try:
            yield
        finally:
            self.current = None

    def _record(self, op) -> None:
        if op.graph is not self.graph:
            return  # ops of graphs built inside a stage (create_graph) stay where they are
        (self.outside if self.current is None else self.stages[self.current]).append(op)

    def stash_and_restore_tensor(self, t: Tensor, from_stage: Optional[int] = None) -> Tensor:
        """``t`` (made in an earlier stage) for use in the current stage; it is stashed until
        its micro-batch reaches this stage. Returns ``t``: the schedule delays it."""
        if self.current is None:
            raise RuntimeError("stash_and_restore_tensor must be called inside a stage.")
        return t

    def stash_and_restore_activations(self, call_info, grad_info) -> Dict[Tensor, Tensor]:
        """The gradient graph's activation inputs (``grad_info.inputs_dict(call_info)``),
        stashed from the forward stage to the current one."""
        return {
            k: self.stash_and_restore_tensor(v) for k, v in grad_info.inputs_dict(call_info).items()
        }


@contextlib.contextmanager
def pipelined_execution(steps: int) -> Iterator[StageContext]:
    """Pipeline the stages created inside over ``steps`` micro-batches (see the module doc)."""
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"pipelined_execution: steps must be a positive int, got {steps!r}.")
    graph = popxl_core.gcg()
    ctx = StageContext(graph, steps)
    hook = get_current_context().register_op_created_hook(ctx._record)
    try:
        yield ctx
    finally:
        get_current_context().remove_op_created_hook(hook)
    _check(ctx)
    _build_schedule(ctx)


def _check(ctx: StageContext) -> None:
    if ctx.outside:
        names = ", ".join(f"{op.type}.{op.id}" for op in ctx.outside[:5])
        raise RuntimeError(
            f"Every op inside pipelined_execution must be in a stage (`with p.stage(i):`); "
            f"not in any stage: {names}."
        )
    want = list(range(len(ctx.stages)))
    if sorted(ctx.stages) != want:
        raise RuntimeError(
            f"pipeline stages must be 0..{len(ctx.stages) - 1}, got {sorted(ctx.stages)}."
        )


class _Plan:
    """What one pipeline's schedule is built from: the stage templates, the tensors that cross
    stages, their stash buffers, the user's ordering within each stage, and the block of each
    op made (a stash shift, or one stage in one time step: `popxl_core.block_order`)."""

    def __init__(self, stages: List[List], cons: List[Tuple]) -> None:
        self.stages, self.cons = stages, cons
        self.crossing = _crossing(stages)
        self.stash: Dict[Tensor, List[Tensor]] = {}
        self.blocks: Dict = {}

    @contextlib.contextmanager
    def block(self) -> Iterator[Dict]:
        """The ops made inside form one block; yields template op -> its copy."""
        g = popxl_core.gcg()
        copies: Dict = {}
        start = len(g.ops)
        yield copies
        key = object()
        for op in g.ops[start:]:
            self.blocks[op] = key
        pairs = [(copies[a], copies[b]) for a, b in self.cons if a in copies and b in copies]
        add_constraints(g, pairs)


def _build_schedule(ctx: StageContext) -> None:
    graph, n = ctx.graph, len(ctx.stages)
    stages = [ctx.stages[j] for j in range(n)]
    # kept before the templates go: the user's `in_sequence` inside a stage orders its copies
    plan = _Plan(stages, constraints_among(graph, [op for st in stages for op in st]))
    _remove(graph, [op for st in stages for op in st])
    with graph:
        plan.stash = {t: _stash_buffers(t, depth) for t, (_, depth) in plan.crossing.items()}
        steps = range(ctx.steps + n - 1)
        active_sets = [[j for j in range(n) if 0 <= t - j < ctx.steps] for t in steps]
        for active, count in _runs(active_sets):
            if len(active) == n and count > 1:
                _repeat_steps(graph, plan, count)
            else:
                for _ in range(count):
                    _time_step(plan, active, {})
    order_blocks(graph, plan.blocks)


def _remove(graph: popxl_core.Graph, moved: List) -> None:
    """Take the stage ops out of ``graph``: they are templates for the schedule's copies."""
    gone = set(moved)
    for op in moved:
        for t in op.outputs:
            if any(c not in gone for c in graph.consumers(t)) or t in graph.outputs:
                raise RuntimeError(
                    f"{t.id!r}, made in a pipeline stage, is used after pipelined_execution: "
                    "a pipeline hands results on through host_store or variables only."
                )
    remove_ops(graph, moved)


def _crossing(stages: List[List]) -> Dict[Tensor, Tuple[int, int]]:
    """Tensors made by one stage and read by a later one -> (their stage, the largest stage
    distance); a tensor read by an earlier stage is an error."""
    made = {t: j for j, st in enumerate(stages) for op in st for t in op.outputs}
    out: Dict[Tensor, Tuple[int, int]] = {}
    for b, st in enumerate(stages):
        for op in st:
            for t in op.inputs:
                a = made.get(t)
                if a is None or a == b:
                    continue
                if a > b:
                    raise RuntimeError(
                        f"{op.type}.{op.id} in pipeline stage {b} reads {t.id!r}, made in the "
                        f"later stage {a}: a stage can only use tensors of earlier stages."
                    )
                out[t] = (a, max(out.get(t, (a, 0))[1], b - a))
    return out


def _stash_buffers(t: Tensor, depth: int) -> List[Tensor]:
    """``depth + 1`` zero buffers for ``t`` on its IPU: slot k holds the value made k time
    steps ago."""
    with popxl_core.ipu(t.ipu):
        return [ops.init(t.shape, t.dtype, f"{t.name}_stash{k}", "zero") for k in range(depth + 1)]


def _runs(active_sets: List[List[int]]) -> List[Tuple[List[int], int]]:
    runs: List[Tuple[List[int], int]] = []
    for a in active_sets:
        if runs and runs[-1][0] == a:
            runs[-1] = (a, runs[-1][1] + 1)
        else:
            runs.append((a, 1))
    return runs


def _time_step(plan: _Plan, active: List[int], remap) -> None:
    """One time step in the current graph: shift every stash, then copy the ops of each
    active stage. ``remap``: outside tensor -> what stands for it here (loop-body inputs)."""

    def here(t):
        return remap.get(t, t)

    with concurrent_ipus():  # each stage on its own IPU, at once (the cycle estimate)
        _shift_stashes(plan, here)
        for j in active:
            with plan.block() as copies:
                _stage_copy(plan, j, here, copies)


def _shift_stashes(plan: _Plan, here) -> None:
    """Slot k takes slot k - 1's value, the oldest first (each copy a block of its own)."""
    for bufs in plan.stash.values():
        for k in range(len(bufs) - 1, 0, -1):
            with plan.block(), popxl_core.ipu(bufs[k].ipu):
                ops.var_updates.copy_var_update_(here(bufs[k]), here(bufs[k - 1]))


def _stage_copy(plan: _Plan, j: int, here, copies: Dict) -> None:
    """A copy of stage ``j``'s ops; a tensor that crosses to a later stage enters slot 0 of
    its stash."""
    local: Dict[Tensor, Tensor] = {}
    for op in plan.stages[j]:
        args = [_source(plan, t, j, local, here) for t in op.inputs]
        copies[op], outs = _clone(op, args)
        for old, new in zip(op.outputs, outs):
            local[old] = new
            if old in plan.stash:
                with popxl_core.ipu(old.ipu):
                    ops.var_updates.copy_var_update_(here(plan.stash[old][0]), new)


def _source(plan: _Plan, t, j, local, here) -> Tensor:
    if t in local:
        return local[t]
    if t in plan.crossing:
        a, _ = plan.crossing[t]
        return here(plan.stash[t][j - a])
    return here(t)


def _clone(op, inputs: List[Tensor]):
    """A copy of ``op`` on ``inputs`` in the current graph, on the op's IPU and tile set;
    returns the new op and its outputs."""
    with popxl_core.ipu(op.ipu), popxl_core.io_tiles() if op.tile_set == "io" else _nothing():
        outs = create_op(
            op.opdef,
            inputs,
            dict(op.attrs),
            called_graphs=op.called_graphs,
            out_names=[t.name for t in op.outputs] or None,
            check_placement=False,
        )
    new = outs[0].producer if outs else popxl_core.gcg().ops[-1]
    assert new is not None  # an op's output has its producer
    new.by_ref_modified = set(op.by_ref_modified)
    new.settings = dict(op.settings)
    return new, outs


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield


def _repeat_steps(graph, plan: _Plan, count: int) -> None:
    """The main phase: one time step with every stage, in a loop of ``count`` iterations."""
    outside, modified = _outside_tensors(plan)
    body = graph.ir.create_empty_graph("pipeline_main")
    with body:
        remap = {t: _input_like(t, t in modified) for t in outside}
        _time_step(plan, list(range(len(plan.stages))), remap)
    order_blocks(body, plan.blocks)
    with plan.block():  # the loop is one block among the ramp-up's and the ramp-down's
        ops.repeat(body, count, inputs_dict={inner: t for t, inner in remap.items()})


def _input_like(t: Tensor, by_ref: bool) -> Tensor:
    """A loop-body input standing for ``t``, placed on ``t``'s IPU."""
    with popxl_core.ipu(t.ipu):
        return popxl_core.graph_input(
            t.shape, t.dtype, t.name, by_ref=by_ref, meta_shape=t.meta_shape or None
        )


def _outside_tensors(plan: _Plan) -> Tuple[List[Tensor], set]:
    """Tensors of the pipeline's graph that the stages read (stash buffers first), and those
    that they write (passed to the loop body by reference)."""
    stages = plan.stages
    made = {t for st in stages for op in st for t in op.outputs}
    out: List[Tensor] = [b for bufs in plan.stash.values() for b in bufs]
    modified = set(out)
    seen = set(out)
    for st in stages:
        for op in st:
            for i, t in enumerate(op.inputs):
                if t in made:
                    continue
                if i in op.modified_inputs():
                    modified.add(t)
                if t not in seen:
                    seen.add(t)
                    out.append(t)
    return out, modified
