"""Kernel fusions chosen at compile time, keeping the arithmetic of the unfused kernels
(eager PyTorch's under ``Ir.numerics = "torch"``).

A matrix transpose (``speed.MATRIX_TRANSPOSE``) of the 2-D float32 result of an op with a
``transposed_kernel`` (MatMul: ``(a @ b).T`` as ``b.T @ a.T``, or under "ipu" numerics
``a @ b`` copied transposed, see `popxl_core.ops.matmul`) that nothing else reads is computed by
that kernel: a contiguous tensor instead of a transposed view. Autodiff of ``x @ w.T`` (every
linear layer) yields exactly this for the weight gradient; the view made the optimizer's
in-place update walk the weight in strided order.
"""

from __future__ import annotations

from typing import Callable, Dict, List

from .. import dtypes
from ..graph import Graph, Op
from .speed import MATRIX_TRANSPOSE, TRANSPOSED_KERNEL

__all__ = ["transposed_matmuls", "transposed_kernel"]


def _consumers(ops: List[Op], g: Graph) -> Dict[object, int]:
    n: Dict[object, int] = {t: 1 for t in g._outputs}
    for op in ops:
        for t in op.inputs:
            n[t] = n.get(t, 0) + 1
    return n


def _fusable(op: Op, uses: Dict[object, int]) -> bool:
    transposes = MATRIX_TRANSPOSE.get(op.opdef)
    if transposes is None or not transposes(op):
        return False
    src = op.inputs[0].producer
    if src is None or TRANSPOSED_KERNEL.get(src.opdef) is None or uses.get(op.inputs[0], 0) != 1:
        return False
    tensors = (*src.inputs, *src.outputs, *op.outputs)
    return all(len(t.shape) == 2 and t.dtype is dtypes.float32 for t in tensors)


def transposed_matmuls(ops: List[Op], g: Graph) -> Dict[Op, Op]:
    """Transpose op -> the op it reads (a MatMul), for each pair computed as one kernel."""
    uses = _consumers(ops, g)
    # `_fusable` checked that the producer is a MatMul (never None)
    return {op: op.inputs[0].producer for op in ops if _fusable(op, uses)}  # type: ignore[misc]


def transposed_kernel(src: Op, numerics: str = "ipu") -> Callable:
    """``(a, b) -> src(a, b).T`` with ``src``'s kernel of the Ir's ``numerics``."""
    return TRANSPOSED_KERNEL[src.opdef](src, numerics)
