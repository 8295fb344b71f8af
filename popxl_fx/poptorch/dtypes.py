"""PopTorch's type rule: the IPU has no 64-bit types.

An int64 or float64 input enters the program as int32 or float32 (popxl_fx's
``Options(narrow_64bit=True)``). The model is still traced on the inputs as given, so an op
that wants int64 indices (``nll_loss``'s target) gets them. An output that torch would give
as int64 or float64 comes back as int32 or float32, as PopTorch's executor returns it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

__all__ = ["ipu_outputs", "narrows"]

_NARROW = {torch.int64: torch.int32, torch.float64: torch.float32}


def ipu_outputs(out: Any) -> Any:
    """``out`` with each int64 / float64 tensor as int32 / float32 (other leaves as given)."""
    return pytree.tree_map(_narrowed, out)


def _narrowed(leaf: Any) -> Any:
    if isinstance(leaf, torch.Tensor) and leaf.dtype in _NARROW:
        return leaf.to(_NARROW[leaf.dtype])
    return leaf


def narrows(out: Any) -> bool:
    """``ipu_outputs`` changes a tensor of ``out``."""
    leaves = pytree.tree_leaves(out)
    return any(isinstance(x, torch.Tensor) and x.dtype in _NARROW for x in leaves)
