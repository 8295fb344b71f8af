"""One ``convolution_backward`` call for a convolution's data and weight gradients.

Autodiff of a Conv makes two ops, ConvDataGrad(dy, w) and ConvWeightsGrad(dy, x), and each
kernel asks torch's ``convolution_backward`` for one of the two results, passing a shape-only
stand-in for the operand it does not read. Eager PyTorch asks for both in one call: the backend
then shares its work on ``dy`` (layout conversion, im2col) and skips materialising the
stand-ins, about 25-35% less time for resnet-sized layers on CPU. Each result of the joint call
is the same computation as the single one (torch's backends compute ``dx`` and ``dw`` with
separate GEMMs), so numbers are equal to the bit; tests compare the compiled program with the
reference interpreter, which runs the two ops apart.

The compiler pairs a data-gradient and a weight-gradient op (``speed.JOINT_GRAD``, declared in
`popxl_core.ops.conv`) that read the same ``dy`` with the same convolution attributes and
matching shapes (whatever produced ``x`` and ``w``: each
result reads only its own operand), and moves the later one up to the earlier one when that is
safe: all its inputs exist there and no op in between writes their storage.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Tuple

from ..graph import Op
from .foreach import root
from .speed import JOINT_GRAD

__all__ = ["conv_backward_pairs", "conv_pair_kernel"]


def _eligible(op: Op) -> bool:
    joint = JOINT_GRAD.get(op.opdef)
    return joint is not None and not op.called_graphs and joint.eligible(op)


def _role(op: Op) -> str:
    return JOINT_GRAD[op.opdef].role


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


def conv_backward_pairs(ops: List[Op]) -> Tuple[List[Op], Dict[Op, Tuple[Op, Op]]]:
    """``ops`` with each paired op moved right after its partner, and first op of each pair
    -> (data-gradient op, weight-gradient op).

    Every check is made on the original order: a move only takes a pure op earlier, past
    its partner's readers' producers, so it cannot invalidate another pair's check."""
    pos = {op: k for k, op in enumerate(ops)}
    by_dy: Dict[object, List[Op]] = {}
    for op in ops:
        if _eligible(op):
            by_dy.setdefault(op.inputs[0], []).append(op)
    pairs: Dict[Op, Tuple[Op, Op]] = {}
    moved: Dict[Op, Op] = {}  # first op -> the op that follows it now
    for candidates in by_dy.values():
        weights = [op for op in candidates if _role(op) == "weight"]
        for data in (op for op in candidates if _role(op) == "data"):
            for weight in weights:
                first, later = sorted((data, weight), key=pos.__getitem__)
                matches = JOINT_GRAD[data.opdef].matches(data, weight)
                if matches and _movable(later, pos[first], pos[later], ops, pos):
                    pairs[first], moved[first] = (data, weight), later
                    weights.remove(weight)
                    break
    if not pairs:
        return ops, pairs
    skip = set(moved.values())
    order: List[Op] = []
    for op in ops:
        if op not in skip:
            order.append(op)
            if op in moved:
                order.append(moved[op])
    return order, pairs


def conv_pair_kernel(data: Op) -> Callable:
    """``(dy, x, w) -> (dx, dw)`` in one call (`JointGrad.kernel` of the data-gradient op)."""
    return JOINT_GRAD[data.opdef].kernel(data)
