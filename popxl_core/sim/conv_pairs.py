"""One ``convolution_backward`` call for a convolution's data, weight and bias gradients.

Autodiff of a Conv makes up to three ops, ConvDataGrad(dy, w), ConvWeightsGrad(dy, x) and
ConvBiasGrad(dy, x, w), and each kernel asks torch's ``convolution_backward`` for one of the
results, passing a shape-only stand-in for an operand it does not read. Eager PyTorch asks for
all of them in one call: the backend then shares its work on ``dy`` (layout conversion, im2col)
and skips materialising the stand-ins, about 25-35% less time for resnet-sized layers on CPU;
the bias gradient alone costs as much as a weight gradient (oneDNN's backward-weights pass),
beside one almost nothing (the mixed_precision tutorial's 12x5x63x63 conv: 4.4 ms alone,
0.6 ms with its weight gradient). Each result of the joint call is the same computation as the
single one (torch's backends compute ``dx`` and ``dw`` with separate GEMMs, ``db`` in the
weight pass either way), so numbers are equal to the bit; tests compare the compiled program
with the reference interpreter, which runs the ops apart.

The compiler joins a weight-gradient op with a data-gradient and/or a bias-gradient op
(``speed.JOINT_GRAD``, declared in `popxl_core.ops.conv_grads`) that read the same ``dy``
with the same convolution attributes and matching shapes (whatever produced ``x`` and ``w``:
each result reads only its own operand), and moves the later ones up to the earliest when that
is safe: all their inputs exist there and no op in between writes their storage.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

from ..graph import Op
from .foreach import root
from .speed import JOINT_GRAD

__all__ = ["JointOps", "conv_backward_pairs", "conv_pair_kernel", "joined"]

# (data-gradient op or None, weight-gradient op, bias-gradient op or None)
JointOps = Tuple[Optional[Op], Op, Optional[Op]]


def _eligible(op: Op) -> bool:
    joint = JOINT_GRAD.get(op.opdef)
    return joint is not None and not op.called_graphs and joint.eligible(op)


def _role(op: Op) -> str:
    return JOINT_GRAD[op.opdef].role


def joined(ops: JointOps) -> List[Op]:
    """The ops of a joint call, without the roles it lacks."""
    return [op for op in ops if op is not None]


def _movable(later: Op, at: int, until: int, ops: List[Op], pos: Dict[Op, int]) -> bool:
    """May ``later`` (at position ``until``) run right after position ``at``?"""
    for t in later.inputs:
        p = t.producer
        if p is not None and p in pos and pos[p] > at:
            return False
    roots = {root(t) for t in later.inputs}
    for op in ops[at + 1 : until]:
        if op.called_graphs:
            return False  # a call may write anything it is given; keep it simple
        if any(root(op.inputs[i]) in roots for i in op.modified_inputs()):
            return False
    return True


def _partner(weight: Op, role: str, candidates: List[Op], ops, pos) -> Optional[Op]:
    """The first of ``candidates`` of ``role`` that joins ``weight``'s call, moved to
    whichever of the two runs first (checked on the original order)."""
    for other in candidates:
        if _role(other) != role or not JOINT_GRAD[other.opdef].matches(other, weight):
            continue
        first, later = sorted((other, weight), key=pos.__getitem__)
        if _movable(later, pos[first], pos[later], ops, pos):
            candidates.remove(other)
            return other
    return None


def _joint_sets(ops: List[Op], pos: Dict[Op, int]) -> List[JointOps]:
    by_dy: Dict[object, List[Op]] = {}
    for op in ops:
        if _eligible(op):
            by_dy.setdefault(op.inputs[0], []).append(op)
    found: List[JointOps] = []
    for candidates in by_dy.values():
        for weight in [op for op in candidates if _role(op) == "weight"]:
            data = _partner(weight, "data", candidates, ops, pos)
            bias = _partner(weight, "bias", candidates, ops, pos)
            if data is not None or bias is not None:
                found.append((data, weight, bias))
    return found


def _safe_together(members: List[Op], ops: List[Op], pos: Dict[Op, int]) -> bool:
    """Every member may move to the earliest one (each was checked against the weight op
    only; the earliest may be the data op)."""
    first = min(members, key=pos.__getitem__)
    return all(_movable(op, pos[first], pos[op], ops, pos) for op in members if op is not first)


def conv_backward_pairs(ops: List[Op]) -> Tuple[List[Op], Dict[Op, JointOps]]:
    """``ops`` with each joint call's ops moved right after the first of them, and that first
    op -> (data-gradient op, weight-gradient op, bias-gradient op), None for a role not
    joined.

    Every check is made on the original order: a move only takes a pure op earlier, past
    its partners' readers' producers, so it cannot invalidate another call's check."""
    pos = {op: k for k, op in enumerate(ops)}
    pairs: Dict[Op, JointOps] = {}
    moved: Dict[Op, List[Op]] = {}  # first op -> the ops that follow it now
    for triple in _joint_sets(ops, pos):
        members = sorted(joined(triple), key=pos.__getitem__)
        if _safe_together(members, ops, pos):
            pairs[members[0]], moved[members[0]] = triple, members[1:]
    if not pairs:
        return ops, pairs
    skip = {op for later in moved.values() for op in later}
    order: List[Op] = []
    for op in ops:
        if op not in skip:
            order.append(op)
            order.extend(moved.get(op, ()))
    return order, pairs


def conv_pair_kernel(ops: JointOps) -> Callable:
    """``(dy, x, w) -> (dx, dw, db)`` in one call, None for a role not joined
    (`JointGrad.kernel` of the weight-gradient op)."""
    data, weight, bias = ops
    return JOINT_GRAD[weight.opdef].kernel(weight, (data is not None, True, bias is not None))
