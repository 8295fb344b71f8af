"""Multi-tensor kernels: same-kind elementwise ops of many tensors as one ``torch._foreach_*``.

An optimizer step is the same few elementwise ops for every parameter (SGD's scaled adds,
Adam's lerp, square, sqrt, divide and update). Like ``torch.optim(..., foreach=True)``, the
compiler runs each kind once over the list of all parameters instead of once per parameter.
The foreach kernels apply the same ATen op to each tensor (CPU runs them tensor by tensor), so
every element is computed with the same arithmetic as the single-tensor op: results are equal
to the bit (tests compare with the reference interpreter). On CPU the gain is Python dispatch
(and reading a shared scalar once per group instead of once per tensor). By default
(`compile.Program(foreach_fresh=True)`) ops that allocate their results group too, as
``torch.optim(..., foreach=True)`` does: all of Adam's chain. With ``foreach_fresh=False`` only
ops that update in place or write into a dead input group (SGD's updates, and Adam's lerp_ and
addcmul_), so that each tensor's chain reuses the previous one's dead temporaries. Which is
faster depends on how many temporaries the chain makes: for popxl_fx's Adam written with
torch's lerp_/addcmul_/addcdiv_ (one temporary per parameter) grouping everything measured
faster (seed MLP batch 8, CPU time: 0.92-0.96 of eager Adam against 1.01-1.08); for the older
11-op Adam the per-tensor chains were (benchmarks/RESULTS.md). The SGD, GPT and resnet
programs of the benchmarks compile the same in both modes.

The pass reorders the live schedule: a topological sort over data dependencies and storage
hazards (reads and in-place writes, through views and in-place outputs to the storage they
share) that takes ops in their original order, except that when it takes an op of a groupable
kind it also takes every other op of the same kind that is ready then. Ops with called graphs,
side effects or custom emitters (IO, collectives, remote buffers) are barriers nothing moves
across. Groups are formed over op types and their operand roles, so any sequence of these ops
(popxl_fx's optimizers, addons' var-updates) groups without knowing the optimizer.

The graph's ordering constraints (``in_sequence``) are not kept between ops of these kinds:
they order side effects, and the only side effects here are in-place writes, whose hazards the
dependencies keep. A scalar operand is shared when it is the same tensor or a constant of the
same value.

Kinds (float32 only): Add/Sub/Mul/Div (two tensors of the output's shape, or a tensor and one
shared scalar tensor), Sqrt, Neg, ScaledAdd, ScaledAddLhsInplace, Accumulate ("add"),
AccumulatorScale and CopyVarUpdate, LerpInplace, AddcmulInplace and AddcdivInplace
(`foreach_pointwise.py`), with every scalar operand shared by the whole group.
Ops that declare a multi-tensor kernel of their own (torch's fused optimizer steps) group by
`foreach_multi.multi_tensor_key`, in any dtype.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch

from .. import dtypes
from ..graph import Op
from ..ops._var_updates_common import f32
from ..ops.scaled_add import _number, _scales
from ..tensor import Tensor
from .foreach_multi import multi_tensor_kernel, multi_tensor_key
from .foreach_multi import shared_identity as _same
from .foreach_pointwise import POINTWISE_UPDATES, pointwise_kernel, pointwise_key

__all__ = ["Group", "foreach_schedule", "group_kernel", "group_key", "plan_modes"]

_BINARY = {"Add", "Sub", "Mul", "Div"}
_COMMUTATIVE = {"Add", "Mul"}
_FRESH_TYPES = {"Add", "Sub", "Mul", "Div", "Sqrt"}  # may write into a dead input (mode in0/in1)


@dataclass
class Group:
    """Ops computed by one multi-tensor kernel, in schedule order.

    ``lists``: which input of each op is the per-tensor operand (binary ops: 0, or 1 when a
    shared scalar is the first operand of a commutative op). ``mode``: "fresh" (new outputs),
    "in0"/"in1" (written into the dead input 0/1 of each op, as ``out=`` reuse does)."""

    ops: List[Op]
    key: tuple
    mode: str = "fresh"


def _float32(op: Op) -> bool:
    return all(t.dtype is dtypes.float32 for t in (*op.inputs, *op.outputs))


def _scalar(t: Tensor) -> bool:
    return tuple(t.shape) == ()


def _shape(t: Tensor) -> tuple:
    return tuple(t.shape)


def group_key(op: Op) -> Optional[tuple]:
    """What ops must share to run as one kernel (type, operand roles, shared scalar tensors
    and attributes); None for an op that is never grouped."""
    if op.opdef.extra.get("multi_tensor") is not None:  # any dtype: foreach_multi.py
        return multi_tensor_key(op)
    if op.called_graphs or not op.outputs or not _float32(op):
        return None
    t, ins, out = op.type, op.inputs, _shape(op.outputs[0])
    if t in _BINARY and not op.attrs:
        a, b = ins
        if _shape(a) == out and _shape(b) == out:
            return (t, "LL")
        if _shape(a) == out and _scalar(b) and t != "Sub":
            return (t, "LS", _same(b))
        if _scalar(a) and _shape(b) == out and t in _COMMUTATIVE:
            return (t, "SL", _same(a))
        return None
    if t in ("Sqrt", "Neg") and not op.attrs:
        return (t,)
    if t in ("ScaledAdd", "ScaledAddLhsInplace"):
        x, y, *scales = ins
        if _shape(x) != out or _shape(y) != out or not all(_scalar(s) for s in scales):
            return None
        return (t, op.attrs.get("a"), op.attrs.get("b"), *map(_same, scales))
    if t == "Accumulate" and op.attrs.get("kind") == "add":
        if _shape(ins[0]) != _shape(ins[1]) or not all(_scalar(f) for f in ins[2:]):
            return None
        return (t, op.attrs.get("factor"), *map(_same, ins[2:]))
    if t == "AccumulatorScale":
        factor = op.attrs.get("factor")
        if len(ins) == 1 and (factor is None or factor == 0.0):
            return None  # a constant 0 zeroes (keeps no inf/nan): not a multiply
        return (t, factor, *map(_same, ins[1:]))
    if t == "CopyVarUpdate" and _shape(ins[0]) == _shape(ins[1]):
        return (t,)
    if t in POINTWISE_UPDATES:  # lerp_, addcmul_, addcdiv_ (foreach_pointwise.py)
        return pointwise_key(op)
    return None


def _barrier(op: Op) -> bool:
    return bool(op.called_graphs or op.opdef.side_effect or op.opdef.emit is not None)


def _root(t: Tensor) -> Tensor:
    """The tensor whose storage ``t`` shares: through views and in-place outputs."""
    while t.producer is not None:
        op = t.producer
        if op.opdef.view:
            t = op.inputs[0]
        elif op.opdef.inplace and op.outputs and t is op.outputs[0]:
            t = op.inputs[op.opdef.inplace[0]]
        else:
            break
    return t


def _dependencies(ops: List[Op]) -> Dict[Op, set]:
    """op -> ops of ``ops`` that must run before it (data, read/write hazards, barriers)."""
    index = {op: k for k, op in enumerate(ops)}
    preds: Dict[Op, set] = {op: set() for op in ops}
    writer: Dict[Tensor, Op] = {}
    readers: Dict[Tensor, List[Op]] = {}
    last_barrier: Optional[Op] = None
    since_barrier: List[Op] = []
    for op in ops:
        p = preds[op]
        p.update(t.producer for t in op.inputs if t.producer in index)
        if last_barrier is not None:
            p.add(last_barrier)
        if _barrier(op):
            p.update(since_barrier)
            last_barrier, since_barrier = op, []
        since_barrier.append(op)
        reads = {_root(t) for t in op.inputs}
        writes = {_root(op.inputs[i]) for i in op.modified_inputs()}
        for r in reads:
            if r in writer:
                p.add(writer[r])
        for w in writes:
            if w in writer:
                p.add(writer[w])
            p.update(readers.get(w, ()))
        for r in reads:
            readers.setdefault(r, []).append(op)
        for w in writes:
            writer[w] = op
            readers[w] = [op]
        p.discard(op)
    return preds


def foreach_schedule(ops: List[Op], reusable=None) -> Tuple[List[Op], List[Group]]:
    """``ops`` (a live schedule) reordered so that each group's ops are adjacent, and the
    groups of two or more ops. With ``reusable`` (`inplace.reusable_in` of ``ops``), an
    add/sub/mul/div/sqrt joins a group only if it could write into a dead input: a group of
    fresh results allocates every tensor's result at once (as torch.optim's foreach path
    does), where one op at a time reuses the previous tensor's dead temporaries. The compiler
    passes ``reusable`` when its ``foreach_fresh`` option is off (see the module docstring)."""
    preds = _dependencies(ops)
    index = {op: k for k, op in enumerate(ops)}
    succs: Dict[Op, List[Op]] = {op: [] for op in ops}
    waiting = {op: len(p) for op, p in preds.items()}
    for op, ps in preds.items():
        for q in ps:
            succs[q].append(op)
    keys = {op: group_key(op) for op in ops}
    if reusable is not None:
        for k, op in enumerate(ops):
            if op.type in _FRESH_TYPES and keys[op] is not None:
                if not any(reusable(op.inputs[i], op, k) for _, i in _options(keys[op], op.type)):
                    keys[op] = None
    ready: List[Tuple[int, Op]] = []
    ready_by_key: Dict[tuple, Dict[Op, None]] = {}
    done: set = set()

    def make_ready(op: Op) -> None:
        heapq.heappush(ready, (index[op], op.id, op))
        if keys[op] is not None:
            ready_by_key.setdefault(keys[op], {})[op] = None

    for op in ops:
        if waiting[op] == 0:
            make_ready(op)
    order: List[Op] = []
    groups: List[Group] = []
    while ready:
        _, _, op = heapq.heappop(ready)
        if op in done:
            continue
        taken = [op]
        if keys[op] is not None:
            same = ready_by_key.pop(keys[op])
            taken = sorted(same, key=index.__getitem__)
            if len(taken) > 1:
                groups.append(Group(taken, keys[op]))
        for t in taken:
            done.add(t)
            order.append(t)
        for t in taken:
            for s in succs[t]:
                waiting[s] -= 1
                if waiting[s] == 0:
                    make_ready(s)
    if len(order) != len(ops):
        raise RuntimeError("foreach_schedule: dependency cycle (a bug in the pass).")
    return order, groups


# kernels ------------------------------------------------------------------------------
def _list_index(group: Group) -> int:
    return 1 if group.key[1:2] == ("SL",) else 0


def group_kernel(group: Group) -> Callable:
    """``(*inputs of every op, flattened) -> (output of every op)`` for ``group``."""
    n = len(group.ops[0].inputs)
    op0, t = group.ops[0], group.ops[0].type

    def columns(flat):
        return [list(flat[i::n]) for i in range(n)]

    if t in _BINARY:
        return _binary_kernel(group, columns)
    if t in ("Sqrt", "Neg"):
        fresh, inplace = {
            "Sqrt": (torch._foreach_sqrt, torch._foreach_sqrt_),
            "Neg": (torch._foreach_neg, torch._foreach_neg_),
        }[t]
        if group.mode == "in0":
            return lambda *flat: _apply_(inplace, list(flat))
        return lambda *flat: tuple(fresh(list(flat)))
    if t in ("ScaledAdd", "ScaledAddLhsInplace"):
        return _scaled_add_kernel(group, columns, inplace=t == "ScaledAddLhsInplace")
    if t == "Accumulate":
        factor = op0.attrs.get("factor")

        def accumulate(*flat):
            cols = columns(flat)
            f = f32(cols[2][0] if n > 2 else (1.0 if factor is None else factor))
            tt = cols[0]
            summed = torch._foreach_add(tt, torch._foreach_mul(cols[1], f))
            torch._foreach_copy_(tt, summed)
            return tuple(tt)

        return accumulate
    if t == "AccumulatorScale":
        factor = op0.attrs.get("factor")

        def scale(*flat):
            cols = columns(flat)
            f = f32(cols[1][0] if n > 1 else factor)
            torch._foreach_mul_(cols[0], f)
            return tuple(cols[0])

        return scale
    if t == "CopyVarUpdate":

        def copy(*flat):
            cols = columns(flat)
            torch._foreach_copy_(cols[0], cols[1])
            return tuple(cols[0])

        return copy
    if t in POINTWISE_UPDATES:
        return pointwise_kernel(t, op0.attrs, columns)
    if op0.opdef.extra.get("multi_tensor") is not None:
        return multi_tensor_kernel(group)
    raise ValueError(f"no multi-tensor kernel for {t}")


def _apply_(fn, tensors: List[torch.Tensor]) -> tuple:
    fn(tensors)
    return tuple(tensors)


_FOREACH = {
    "Add": (torch._foreach_add, torch._foreach_add_),
    "Sub": (torch._foreach_sub, torch._foreach_sub_),
    "Mul": (torch._foreach_mul, torch._foreach_mul_),
    "Div": (torch._foreach_div, torch._foreach_div_),
}


def _binary_kernel(group: Group, columns) -> Callable:
    fresh, inplace = _FOREACH[group.ops[0].type]
    roles, mode = group.key[1], group.mode
    if roles == "LL":
        if mode == "fresh":
            return lambda *flat: tuple(fresh(*columns(flat)))
        # in1 only for commutative ops: b op a has the same bits as a op b
        first = 0 if mode == "in0" else 1

        def into(*flat):
            cols = columns(flat)
            inplace(cols[first], cols[1 - first])
            return tuple(cols[first])

        return into
    li = _list_index(group)

    def with_scalar(*flat):
        cols = columns(flat)
        tensors, scalar = cols[li], cols[1 - li][0]
        if mode == "fresh":
            return tuple(fresh(tensors, scalar))
        inplace(tensors, scalar)
        return tuple(tensors)

    return with_scalar


def _scaled_add_kernel(group: Group, columns, inplace: bool) -> Callable:
    """The arithmetic of `ops.scaled_add._kernel` / `_inplace_kernel` over lists."""
    attrs = group.ops[0].attrs
    a, b = attrs.get("a"), attrs.get("b")

    def run(*flat):
        cols = columns(flat)
        xs, ys = cols[0], cols[1]
        sa, sb = (_number(s) for s in _scales([c[0] for c in cols[2:]], a, b))
        one = isinstance(sa, (int, float)) and sa == 1
        if inplace:
            if not one:
                torch._foreach_mul_(xs, sa)
            torch._foreach_add_(xs, ys, alpha=sb)
            return tuple(xs)
        scaled = xs if one else torch._foreach_mul(xs, sa)
        return tuple(torch._foreach_add(scaled, ys, alpha=sb))

    return run


def plan_modes(
    groups: List[Group], order: List[Op], reusable, keep_fresh: bool = False
) -> Tuple[Dict[Op, object], List[Group]]:
    """Decide each group's mode on the final ``order``; returns op -> the input it writes,
    for the ``out=`` reuse planner, and the groups kept: an add/sub/mul/div/sqrt group that
    cannot write into dead inputs is left to run op by op (see `foreach_schedule`).
    ``reusable(t, op, k)`` says whether op (at position k of ``order``) may overwrite ``t``."""
    pos = {op: k for k, op in enumerate(order)}
    fixed: Dict[Op, object] = {}
    kept: List[Group] = []
    for grp in groups:
        if grp.ops[0].type in _FRESH_TYPES:
            grp.mode = _mode(grp, pos, reusable)
            if grp.mode == "fresh" and not keep_fresh:
                continue
            for op in grp.ops:
                fixed[op] = _written_input(grp, op)
        kept.append(grp)
    return fixed, kept


def _options(key: tuple, t: str) -> List[Tuple[str, int]]:
    """(mode, input written) pairs an op of this key may use."""
    if t in _BINARY and key[1] == "LL":
        return [("in0", 0)] + ([("in1", 1)] if t in _COMMUTATIVE else [])
    return [("in0", 1 if key[1:2] == ("SL",) else 0)]


def _mode(grp: Group, pos, reusable) -> str:
    """ "in0": into the per-tensor operand (input 0, or 1 when a scalar comes first); "in1":
    into input 1 of a commutative op of two tensors; else "fresh"."""
    for mode, i in _options(grp.key, grp.ops[0].type):
        if all(reusable(op.inputs[i], op, pos[op]) for op in grp.ops):
            return mode
    return "fresh"


def _written_input(grp: Group, op: Op):
    if grp.mode == "fresh":
        return None
    return op.inputs[_list_index(grp) if grp.mode == "in0" else 1]
