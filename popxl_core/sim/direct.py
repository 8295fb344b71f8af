"""Kernels the generated code calls directly, without the op table's Python wrapper.

A small step (the GPT case: ~300 view ops and 75 matmuls a step) is bound by per-op Python
overhead, and the table's kernels add a frame (and a ``functools.partial`` for attributes) to
each torch call. For the commonest ops in plain float32, the compiler writes the torch call
itself into the generated source: the same torch function with the same arguments as the
table's kernel, so the same bits (the reference-interpreter tests compare them).

* ``Reshape``: ``torch.reshape(x, shape)``; ``Transpose``: ``x.permute(permutation)`` (view
  ops, only where the compiler does not copy the view);
* ``MatMul`` without an output type or with float32, under ``Ir.numerics == "torch"`` only:
  ``torch.matmul(a, b)`` (the table's torch kernel adds a no-op ``.to(float32)``; under
  ``"ipu"`` the table's row-stable kernel runs);
* ``Add``, ``Sub``, ``Mul`` (no attributes): ``torch.add/sub/mul(a, b)``.
"""

from __future__ import annotations

from typing import Callable, Optional

from .. import dtypes
from ..graph import Op

__all__ = ["direct_call"]

_BINARY = {"Add": "torch.add", "Sub": "torch.sub", "Mul": "torch.mul"}


def _float32(op: Op) -> bool:
    return all(t.dtype is dtypes.float32 for t in (*op.inputs, *op.outputs))


def direct_call(
    op: Op, name: Callable, literal: Callable, numerics: str = "torch"
) -> Optional[str]:
    """The expression computing ``op``'s single output, or None to use the table's kernel.
    ``name(t)`` names a tensor, ``literal(value)`` binds a constant value and names it;
    ``numerics`` is the Ir's (`popxl_core.Ir.numerics`)."""
    if len(op.outputs) != 1 or not _float32(op):
        return None
    t, ins = op.type, [name(x) for x in op.inputs]
    if t == "Reshape" and set(op.attrs) == {"shape"}:
        return f"torch.reshape({ins[0]}, {literal(tuple(op.attrs['shape']))})"
    if t == "Transpose" and set(op.attrs) == {"permutation"}:
        return f"{ins[0]}.permute({literal(tuple(op.attrs['permutation']))})"
    if (
        t == "MatMul"
        and numerics == "torch"
        and op.attrs.get("output_type") in (None, dtypes.float32)
    ):
        return f"torch.matmul({ins[0]}, {ins[1]})"
    if t in _BINARY and not op.attrs and len(ins) == 2:
        return f"{_BINARY[t]}({ins[0]}, {ins[1]})"
    return None
