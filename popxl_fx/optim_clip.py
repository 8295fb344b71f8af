"""Gradient clipping by global norm before the update: a param group's ``max_grad_norm``
(PopTorch's ``poptorch.optim.SGD/Adam/AdamW(max_grad_norm=...)``).

The arithmetic is ``torch.nn.utils.clip_grad_norm_``'s: each gradient's L2 norm, the L2 norm
of those norms (in the optimizer's parameter order), ``coef = max_norm / (total + 1e-6)``
(torch writes it as ``reciprocal(total + 1e-6) * max_norm``) clamped at 1, every gradient
multiplied by it. The norm spans all the optimizer's gradients, so it is refused where the
update sees only part of them (a phase at a time, or RTS shards).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import popxl_core as popxl
from popxl_core import ops

from .optim_groups import UnsupportedOptimizerError

__all__ = ["clipped", "max_grad_norm"]


def max_grad_norm(optimizer) -> float:
    """The optimizer's clipping norm (inf: none); one value for all its groups."""
    norms = {float(pg.get("max_grad_norm", math.inf)) for pg in optimizer.param_groups}
    if len(norms) > 1:
        raise UnsupportedOptimizerError(
            f"the param groups have different max_grad_norm values {sorted(norms)}; the "
            "gradients are clipped by one global norm, so give them one value."
        )
    return norms.pop()


def clipped(program, grads: Mapping[str, popxl.Tensor]) -> Mapping[str, popxl.Tensor]:
    """``grads`` clipped by the optimizer's ``max_grad_norm`` (themselves when it is inf)."""
    max_norm = max_grad_norm(program.optimizer)
    if math.isinf(max_norm) or not grads:
        return grads
    if program.remote is not None or program.replication.sharded:
        raise UnsupportedOptimizerError(
            "max_grad_norm needs every gradient at once; phased execution and replicated "
            "tensor sharding update a part of them at a time."
        )
    names = [n for n in program.params if n in grads]
    norms = [ops.reshape(ops.l2(ops.cast(grads[n], popxl.float32)), (1,)) for n in names]
    total = ops.l2(ops.concat(norms, 0))
    one = popxl.constant(1.0, popxl.float32)
    inverse = ops.div(one, ops.add(total, popxl.constant(1e-6, popxl.float32)))
    coef = ops.clip(ops.mul(inverse, popxl.constant(max_norm, popxl.float32)), max=1.0)
    return {n: (ops.mul(g, ops.cast(coef, g.dtype)) if n in names else g) for n, g in grads.items()}
