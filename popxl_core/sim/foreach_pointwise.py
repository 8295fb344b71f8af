"""Multi-tensor kernels for the fused in-place updates ``lerp_``, ``addcmul_``, ``addcdiv_``.

popxl_fx's Adam (torch's single-tensor arithmetic) runs these three once per parameter
(`popxl_core.ops._var_updates_pointwise`). Ops of one kind that share their scalar (the same
scalar tensor, e.g. one hyper-parameter stream of a param group, or an equal float attribute)
run as one ``torch._foreach_lerp_`` / ``_foreach_addcmul_`` / ``_foreach_addcdiv_`` over the
lists, as ``torch.optim.Adam(foreach=True)`` does.

Same bits as the single-tensor kernels: the scalar reaches the foreach kernel as the same Python
float the op's kernel passes to ``Tensor.lerp_`` / ``addcmul_`` / ``addcdiv_`` (the ``Scalar``
overloads, not the ``Tensor`` ones), and on CPU the foreach kernels loop over the lists calling
those same ATen ops tensor by tensor (lerp picks its formula by the weight per call, as the
single op does). tests/test_foreach.py and tests/test_reference_fused.py compare with the
reference interpreter to the bit.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ..graph import Op
from ..ops._var_updates_pointwise import _value
from .foreach_multi import shared_identity

__all__ = ["POINTWISE_UPDATES", "pointwise_key", "pointwise_kernel"]

# op type -> (number of tensor operands after the target, the multi-tensor kernel)
POINTWISE_UPDATES = {
    "LerpInplace": (1, torch._foreach_lerp_),
    "AddcmulInplace": (2, torch._foreach_addcmul_),
    "AddcdivInplace": (2, torch._foreach_addcdiv_),
}


def pointwise_key(op: Op) -> Optional[tuple]:
    """The group key of a lerp_/addcmul_/addcdiv_ op: its type, float scalar attribute and
    shared scalar tensor; None when an operand broadcasts (the
    foreach kernels want one tensor per target)."""
    n, _ = POINTWISE_UPDATES[op.type]
    target, operands, extra = op.inputs[0], op.inputs[1 : 1 + n], op.inputs[1 + n :]
    if any(tuple(x.shape) != tuple(target.shape) for x in operands):
        return None
    return (op.type, op.attrs.get("scalar"), *map(shared_identity, extra))


def pointwise_kernel(t: str, attrs: dict, columns: Callable) -> Callable:
    """``(*inputs of every op, flattened) -> (targets)``, updated in place."""
    n, kernel = POINTWISE_UPDATES[t]
    scalar = attrs.get("scalar")

    def run(*flat):
        cols = columns(flat)
        targets = cols[0]
        # the op kernel's conversion: float attribute, or .item() of the float32 scalar tensor
        value = _value(cols[1 + n][:1] if len(cols) > 1 + n else (), scalar)
        kernel(targets, *cols[1 : 1 + n], value)
        return tuple(targets)

    return run
