"""Kernel fusions chosen at compile time, keeping the arithmetic of the unfused kernels
(eager PyTorch's under ``Ir.numerics = "torch"``).

``transpose(matmul(a, b))`` on 2-D float32 tensors is computed as ``matmul(b.T, a.T)``: the
same products, but the result is a contiguous tensor instead of a transposed view. Under
``"ipu"`` numerics it is ``matmul(a, b)`` copied transposed: the bits of the unfused pair, whose
rows do not depend on the row count (``matmul(b.T, a.T)`` would make them columns). Autodiff of
``x @ w.T`` (every linear layer) yields exactly this for the weight gradient; the view made the
optimizer's in-place update walk the weight in strided order. ``matmul(b.T, a.T)`` is the call
eager PyTorch makes for a linear layer's weight gradient (``grad_out.t().mm(input)``).
"""

from __future__ import annotations

import functools
from typing import Callable, Dict, List

from .. import dtypes
from ..graph import Graph, Op

__all__ = ["transposed_matmuls", "transposed_matmul_kernel"]


def _consumers(ops: List[Op], g: Graph) -> Dict[object, int]:
    n: Dict[object, int] = {t: 1 for t in g._outputs}
    for op in ops:
        for t in op.inputs:
            n[t] = n.get(t, 0) + 1
    return n


def _fusable(op: Op, uses: Dict[object, int]) -> bool:
    if op.type != "Transpose" or tuple(op.attrs.get("permutation", ())) != (1, 0):
        return False
    mm = op.inputs[0].producer
    if mm is None or mm.type != "MatMul" or uses.get(op.inputs[0], 0) != 1:
        return False
    tensors = (*mm.inputs, *mm.outputs, *op.outputs)
    return all(len(t.shape) == 2 and t.dtype is dtypes.float32 for t in tensors)


def transposed_matmuls(ops: List[Op], g: Graph) -> Dict[Op, Op]:
    """Transpose op -> the MatMul it reads, for each pair computed as one matmul."""
    uses = _consumers(ops, g)
    return {op: op.inputs[0].producer for op in ops if _fusable(op, uses)}


def transposed_matmul_kernel(mm: Op, numerics: str = "ipu") -> Callable:
    """``(a, b) -> (a @ b).T`` computed as ``b.T @ a.T`` with ``mm``'s own kernel (the one
    of the Ir's ``numerics``)."""
    base = mm.opdef.kernel_for(numerics)
    kernel = functools.partial(base, **mm.attrs) if mm.attrs else base

    def matmul_t(a, b):
        return kernel(b.t(), a.t())

    def matmul_then_t(a, b):  # "ipu": the rows of a @ b keep their bits (a copy, contiguous)
        return kernel(a, b).t().contiguous()

    return matmul_then_t if numerics == "ipu" else matmul_t
