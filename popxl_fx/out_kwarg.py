"""torch's ``out=`` keyword in a traced call (``torch.matmul(x, y, out=buf)``).

A lowering computes the op's value; ``out`` only says where eager torch puts it. So the
driver calls the lowering without ``out`` and gives the result ``out``'s dtype, as torch
writes it into that tensor. Later users of ``out`` see the result too (the driver rebinds
it, as for an in-place op). ``out=None`` is dropped. A lowering whose ``takes_out``
attribute is true gets ``out`` itself (``cumsum`` sums in ``out``'s dtype: torch casts the
input first, not the result).
"""

from __future__ import annotations

from typing import Any

import torch.fx as fx

import popxl_core as popxl
from popxl_core import ops

__all__ = ["into_out", "out_target", "without_out"]


def out_target(node: fx.Node) -> fx.Node | None:
    """The node whose tensor a function or method call writes with ``out=``."""
    out = node.kwargs.get("out") if node.op in ("call_function", "call_method") else None
    return out if isinstance(out, fx.Node) else None


def without_out(node: fx.Node, kwargs: dict) -> tuple[dict, Any]:
    """``kwargs`` less ``out``, and the ``out`` value (None when there is none)."""
    if node.op not in ("call_function", "call_method") or "out" not in kwargs:
        return kwargs, None
    rest = dict(kwargs)
    return rest, rest.pop("out")


def into_out(result: Any, out: Any) -> Any:
    """``result`` as torch writes it into ``out``: in ``out``'s dtype."""
    if not isinstance(out, popxl.Tensor) or not isinstance(result, popxl.Tensor):
        return result
    return result if result.dtype == out.dtype else ops.cast(result, out.dtype)
