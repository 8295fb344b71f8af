"""Ops with a multi-tensor kernel of their own, grouped by `foreach.py`.

An op whose table row has ``extra["multi_tensor"]`` (torch's fused optimizer steps,
ops/_var_updates_fused.py) declares the list form of its kernel: ``multi(values, **attrs)``
with one ``{role: tensor}`` dict per op, returning each op's output 0. Ops of one type with
the same attributes, the same parameter dtype and the same hyper-parameter tensors
(``extra["shared_inputs"]``, by role) run as one call, as ``torch.optim(fused=True)`` updates
a param group with one kernel call.
"""

from __future__ import annotations

from typing import Callable, Optional

from ..graph import Op
from ..tensor import Constant, Tensor

__all__ = ["multi_tensor_kernel", "multi_tensor_key", "shared_identity"]


def shared_identity(t: Tensor) -> object:
    """A shared operand's identity in a group key: the tensor, or a constant's value
    (``x + 1e-3`` makes one constant per op; equal values may share a kernel)."""
    if isinstance(t, Constant):
        return ("constant", t.dtype.name, t._data.tobytes())
    return t


def multi_tensor_key(op: Op) -> Optional[tuple]:
    """What ops must share to run as one call of their multi-tensor kernel; None for ops
    without one."""
    extra = op.opdef.extra
    if extra.get("multi_tensor") is None or op.called_graphs or not op.outputs:
        return None
    roles = op.attrs["roles"]
    shared_roles = extra["shared_inputs"]
    shared = tuple(shared_identity(t) for r, t in zip(roles, op.inputs) if r in shared_roles)
    attrs = tuple(sorted(op.attrs.items()))
    return ("multi_tensor", op.type, op.outputs[0].dtype.name, attrs, shared)


def multi_tensor_kernel(group) -> Callable:
    """``(*inputs of every op, flattened) -> (output 0 of every op)``: one call of the ops'
    multi-tensor kernel."""
    op0 = group.ops[0]
    attrs = dict(op0.attrs)
    roles = attrs.pop("roles")
    multi, n = op0.opdef.extra["multi_tensor"], len(op0.inputs)

    def run(*flat):
        values = [dict(zip(roles, flat[i : i + n])) for i in range(0, len(flat), n)]
        return tuple(multi(values, **attrs))

    return run
