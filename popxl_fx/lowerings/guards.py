"""`popxl_fx.guards.data_check` (a model's ``if bad: raise`` guard) as a run-time check."""

from __future__ import annotations

import popxl_core as popxl
from popxl_core import ops

from ..guards import data_check
from ..lowering import lowers
from ._common import is_t

__all__: list = []


@lowers(data_check)
def _data_check(ctx, cond, passed: bool, where: str, text: str) -> None:
    if not is_t(cond):
        return None
    if cond.dtype != popxl.bool:
        cond = ops.cast(cond, popxl.bool)  # bool() of a one-element tensor: nonzero
    ok = cond if passed else ops.logical_not(cond)
    ops.runtime_check(
        ok,
        f"the data fails the model's check at {where} (`{text}` is "
        f"{not passed} on this batch, {passed} when the program was captured)",
        where,
    )
    return None
