"""Kernels the generated code calls directly, without the op table's Python wrapper.

A small step (the GPT case: ~300 view ops and 75 matmuls a step) is bound by per-op Python
overhead, and the table's kernels add a frame (and a ``functools.partial`` for attributes) to
each torch call. For the commonest ops in plain float32, the compiler writes the torch call
itself into the generated source: the same torch function with the same arguments as the
table's kernel, so the same bits (the reference-interpreter tests compare them).

* ``Reshape``: ``torch.reshape(x, shape)``; ``Transpose``: ``x.permute(permutation)`` (view
  ops, only where the compiler does not copy the view);
* ``MatMul`` under ``Ir.numerics == "torch"`` (popxl_fx's programs), or under ``"ipu"`` on
  shapes that kernel does not pad, without an output type or with float32:
  ``torch.matmul(a, b)`` (those kernels add a no-op ``.to(float32)``);
* ``Add``, ``Sub``, ``Mul`` (no attributes): ``torch.add/sub/mul(a, b)``.
"""

from __future__ import annotations

from typing import Callable, Optional

from .. import dtypes
from ..graph import Op
from ..ops.matmul import runs_unpadded

__all__ = ["direct_call"]

_BINARY = {"Add": "torch.add", "Sub": "torch.sub", "Mul": "torch.mul"}


def _float32(op: Op) -> bool:
    return all(t.dtype is dtypes.float32 for t in (*op.inputs, *op.outputs))


def _plain_matmul(op: Op) -> bool:
    """The MatMul's kernel is torch.matmul: "torch" numerics, or "ipu" numerics on shapes
    it does not pad (`ops.matmul.runs_unpadded`)."""
    if op.graph.ir.numerics == "torch":
        return True
    return runs_unpadded(tuple(op.inputs[0].shape), tuple(op.inputs[1].shape))


def direct_call(op: Op, name: Callable, literal: Callable) -> Optional[str]:
    """The expression computing ``op``'s single output, or None to use the table's kernel.
    ``name(t)`` names a tensor, ``literal(value)`` binds a constant value and names it."""
    if len(op.outputs) != 1 or not _float32(op):
        return None
    t, ins = op.type, [name(x) for x in op.inputs]
    if t == "Reshape" and set(op.attrs) == {"shape"}:
        return f"torch.reshape({ins[0]}, {literal(tuple(op.attrs['shape']))})"
    if t == "Transpose" and set(op.attrs) == {"permutation"}:
        return f"{ins[0]}.permute({literal(tuple(op.attrs['permutation']))})"
    if (
        t == "MatMul"
        and _plain_matmul(op)
        and op.attrs.get("output_type") in (None, dtypes.float32)
    ):
        return f"torch.matmul({ins[0]}, {ins[1]})"
    if t in _BINARY and not op.attrs and len(ins) == 2:
        return f"{_BINARY[t]}({ins[0]}, {ins[1]})"
    return None
