"""Planning mode: build and plan a program whose weights are never made (what-if for POD sizes).

An `Ir` created in planning mode (inside `planning()`, or with ``POPXL_SIM_PLAN=1`` set for a
script run unchanged) is built as usual, but its variables carry only their shape and dtype:
whatever data a program passes, the variable keeps a read-only broadcast of one zero
(`host_data.is_fill`), which costs no host memory, and popxl.addons' variable factories draw
no values (and write no memmap files). A Session of such an Ir verifies it and makes the same
plan as a real build (memory per IPU, code, Streaming Memory, cycles), so ``session.report``
works; an out-of-memory plan is reported and warned of rather than raised, since seeing
it is the point. Anything that needs values (attaching, ``run``, reading or writing variables)
raises `PlanOnlyError`. Graphcore's applications fill their full-size weights on the host
(GPT-3 175B: 350 GB of float16), so their POD configurations can only be planned this way.

Example:
    >>> import numpy as np, popxl_core as popxl
    >>> from popxl_core.planning import planning
    >>> with planning():
    ...     ir = popxl.Ir()
    >>> with ir.main_graph:
    ...     w = popxl.variable(np.ones((1024, 1024), np.float32), name="w")
    >>> w._data.strides, ir.planning
    ((0, 0), True)
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

import numpy as np
import torch

__all__ = ["ENV", "PlanOnlyError", "planning", "planning_default", "weightless"]

ENV = "POPXL_SIM_PLAN"

# how many `planning()` blocks are open: an Ir reads this once, when it is created
_depth = [0]


class PlanOnlyError(RuntimeError):
    """A value was asked of a program built in planning mode, which has none."""


@contextlib.contextmanager
def planning() -> Iterator[None]:
    """Irs created inside the block are built in planning mode (module docstring)."""
    _depth[0] += 1
    try:
        yield
    finally:
        _depth[0] -= 1


def planning_default() -> bool:
    """Whether an Ir created now is a planning one: inside `planning()`, or ``POPXL_SIM_PLAN``
    set to anything but ``""`` or ``"0"``."""
    return _depth[0] > 0 or os.environ.get(ENV, "") not in ("", "0")


def weightless(data):
    """``data``'s shape and dtype without its values: a read-only broadcast of one zero.

    Scalars and one-element data are kept (they cost nothing and a fill needs two elements);
    a torch tensor is seen through numpy (bfloat16 ones, which numpy lacks, are kept).
    """
    if isinstance(data, torch.Tensor):
        if data.dtype == torch.bfloat16:
            return data
        data = data.detach().cpu().numpy()
    arr = data if isinstance(data, np.ndarray) else np.asarray(data)
    if arr.size <= 1:
        return data
    return np.broadcast_to(np.zeros((), arr.dtype), arr.shape)
