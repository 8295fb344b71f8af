"""Optimizer state stored in float16: a param group's ``first_order_momentum_accum_type``,
``second_order_momentum_accum_type`` or ``velocity_accum_type`` (PopTorch's accumulator
dtypes, which halve the state's memory on the IPU).

The state variable has the dtype asked for. The update reads it into the weight's dtype,
runs the same ops as with float32 state, and rounds the result back into the variable: the
moments are kept to float16 precision between steps and computed in float32, as the IPU's
var-update kernels compute float16 accumulators with float32 scalars.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

import popxl_core as popxl
from popxl_core import ops

__all__ = ["DTYPE_KEYS", "stored_dtype", "with_storage"]

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


def stored_dtype(kind: str, pg: Mapping, key: str) -> popxl.dtype | None:
    """The dtype ``key``'s state is stored in (None: the weight's)."""
    dtype = pg.get(_KEYS.get(kind, {}).get(key, ""))
    if dtype is None or dtype == torch.float32:
        return None
    if dtype != torch.float16:
        raise ValueError(f"{_KEYS[kind][key]}={dtype}: give torch.float32 or torch.float16.")
    return popxl.float16


def with_storage(kind: str, update: Callable) -> Callable:
    """``update(name, p, grad, hp, pg, state=...)`` with its float16-stored state read into
    the weight's dtype and written back after it."""

    def run(name, p, grad, hp, pg, state: Callable) -> None:
        working: list[tuple] = []

        def stored(n: str, key: str, like, dtype=None):
            want = None if key == "step" else stored_dtype(kind, pg, key)
            if want is None or want == like.dtype:
                return state(n, key, like, dtype)
            var = state(n, key, like, want)
            work = ops.cast(var, like.dtype)
            working.append((var, work))
            return work

        update(name, p, grad, hp, pg, state=stored)
        for var, work in working:
            ops.var_updates.copy_var_update_(var, ops.cast(work, var.dtype))

    return run
