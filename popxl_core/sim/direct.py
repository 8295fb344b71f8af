"""Kernels the generated code calls directly, without the op table's Python wrapper.

A small step (the GPT case: ~300 view ops and 75 matmuls a step) is bound by per-op Python
overhead, and the table's kernels add a frame (and a ``functools.partial`` for attributes) to
each torch call. For the commonest ops in plain float32, the compiler writes the torch call
itself into the generated source: the same torch function with the same arguments as the
table's kernel, so the same bits (the reference-interpreter tests compare them). Each op
declares its call next to its kernel (``speed.DIRECT``): reshape, transpose (view ops, only
where the compiler does not copy the view), matmul where its kernel is ``torch.matmul``, and
add/sub/mul without attributes.
"""

from __future__ import annotations

from typing import Callable, Optional

from ..graph import Op
from ..ops.forms import float32_only
from .speed import DIRECT

__all__ = ["direct_call"]


def direct_call(op: Op, name: Callable, literal: Callable) -> Optional[str]:
    """The expression computing ``op``'s single output, or None to use the table's kernel.
    ``name(t)`` names a tensor, ``literal(value)`` binds a constant value and names it."""
    direct = DIRECT.get(op.opdef)
    if direct is None or len(op.outputs) != 1 or not float32_only(op):
        return None
    return direct(op, [name(x) for x in op.inputs], literal)
