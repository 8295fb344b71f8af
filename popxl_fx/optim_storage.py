"""PopTorch's accumulator dtypes: a param group's ``velocity_accum_type``,
``first_order_momentum_accum_type`` and ``second_order_momentum_accum_type``
(``poptorch.optim``'s arguments, float32 unless given) are the dtypes of the optimizer
state, whatever the weight's dtype.

A group that names them is a PopTorch group, stepped as PopART steps it: the update of a
float16 weight is computed in float32 (the weight and its gradient read into float32, the
hyper-parameters float32 streams) and the new weight rounded to float16 once, when written
back; state stored in float16 is read into float32 and rounded back after the update. A
group without them (torch's own optimizers) keeps torch's rule: state and arithmetic in the
weight's dtype. ``poptorch.optim``'s eager ``step`` follows the same rule
(`popxl_fx.poptorch.optim_half`), so the two agree bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

import popxl_core as popxl
from popxl_core import ops

__all__ = [
    "DTYPE_KEYS",
    "compute_dtype",
    "ipu_group",
    "stored_dtype",
    "torch_stored_dtype",
    "with_storage",
]

_FIRST, _SECOND = "first_order_momentum_accum_type", "second_order_momentum_accum_type"
_ADAM = {"exp_avg": _FIRST, "exp_avg_sq": _SECOND}
# per optimizer kind: torch's state key -> the param group key naming its dtype
_KEYS = {
    "sgd": {"momentum_buffer": "velocity_accum_type"},
    "adam": _ADAM,
    "lamb": _ADAM,
    "rmsprop": {"square_avg": _SECOND, "grad_avg": _SECOND, "momentum_buffer": _FIRST},
}
DTYPE_KEYS = ("velocity_accum_type", _FIRST, _SECOND)
_DTYPES = {torch.float32: popxl.float32, torch.float16: popxl.float16}


def ipu_group(pg: Mapping) -> bool:
    """The group names accumulator dtypes (a PopTorch optimizer's group)."""
    return any(k in pg for k in DTYPE_KEYS)


def stored_dtype(kind: str, pg: Mapping, key: str) -> popxl.dtype | None:
    """The dtype ``key``'s state is stored in (None: the weight's, torch's rule)."""
    group_key = _KEYS.get(kind, {}).get(key, "")
    dtype = pg.get(group_key)
    if dtype is None:
        return None
    if dtype not in _DTYPES:
        raise ValueError(f"{group_key}={dtype}: give torch.float32 or torch.float16.")
    return _DTYPES[dtype]


def torch_stored_dtype(kind: str, pg: Mapping, key: str) -> torch.dtype:
    """`stored_dtype` of a PopTorch group as a torch dtype (eager steps compute in float32;
    a state key without an accumulator dtype, ``step`` included, is float32)."""
    dtype = stored_dtype(kind, pg, key)
    return torch.float16 if dtype == popxl.float16 else torch.float32


def compute_dtype(pg: Mapping, weight: popxl.dtype) -> popxl.dtype:
    """The dtype a weight's update is computed in: float32 for a float16 weight of a
    PopTorch group (PopART's var-update kernels), else the weight's."""
    return popxl.float32 if weight == popxl.float16 and ipu_group(pg) else weight


def with_storage(kind: str, update: Callable) -> Callable:
    """``update(name, p, grad, hp, pg, state=...)`` run in `compute_dtype`: the weight, its
    gradient and state stored in another dtype read into it, and written back after it."""

    def run(name, p, grad, hp, pg, state: Callable) -> None:
        working: list[tuple] = []
        work_p = _working(p, compute_dtype(pg, p.dtype), working)
        if grad.dtype != work_p.dtype:
            grad = ops.cast(grad, work_p.dtype)

        def stored(n: str, key: str, like, dtype=None):
            want = None if key == "step" else stored_dtype(kind, pg, key)
            if want is None or want == like.dtype:  # named: an outlined caller makes it so
                return state(n, key, like, want or dtype)
            return _working(state(n, key, like, want), like.dtype, working)

        update(name, work_p, grad, hp, pg, state=stored)
        for var, work in working:
            ops.var_updates.copy_var_update_(var, ops.cast(work, var.dtype))

    return run


def _working(var: popxl.Tensor, dtype: popxl.dtype, working: list) -> popxl.Tensor:
    """``var`` read into ``dtype`` (itself when it is of it), remembered to write back."""
    if var.dtype == dtype:
        return var
    work = ops.cast(var, dtype)
    working.append((var, work))
    return work
