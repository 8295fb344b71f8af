"""Wrappers around an op's kernel that make torch compute what the IPU computes: float16 in
float32, uint16/uint32 through int64, a view copied where it may not alias; and, in tests, a
check of every output against the op table's spec. The compiler (`compile`) and the reference
interpreter (`reference`) wrap their kernels with the same functions.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..graph import Op

__all__ = [
    "cloning",
    "fp16_in_fp32",
    "fp16_via_fp32",
    "spec_checked",
    "touches_narrow_unsigned",
    "unsigned_via_int64",
]


def spec_checked(kernel: Callable, op: Op) -> Callable:
    """Reference mode for tests: assert every kernel output matches the op's inferred spec."""
    want = [(tuple(t.shape), t.dtype.as_torch()) for t in op.outputs]

    def run(*args):
        res = kernel(*args)
        got = res if isinstance(res, tuple) else (res,)
        have = [(tuple(r.shape), r.dtype) for r in got] if op.outputs else []
        if have != want:
            raise AssertionError(
                f"{op.type}.{op.id}: kernel produced {have}, the op table inferred {want}"
            )
        return res

    return run


def fp16_in_fp32(op: Op) -> bool:
    """Whether ``op`` computes its float16 inputs in float32 (`OpDef.fp16_in_fp32`): on the
    IPU's numerics; with ``Ir.numerics == "torch"`` torch's own float16 kernels run, as eager
    PyTorch runs a ``model.half()`` (popxl_fx's reference, bit for bit)."""
    return op.opdef.fp16_in_fp32 and op.graph.ir.numerics != "torch" and _touches_fp16(op)


def _touches_fp16(op: Op) -> bool:
    from .. import dtypes

    return any(t.dtype is dtypes.float16 for t in (*op.inputs, *op.outputs))


def fp16_via_fp32(kernel: Callable, op: Op) -> Callable:
    """Compute in float32 and round results to the declared dtypes (IPU AMP semantics)."""
    return _computed_wide(kernel, op, lambda a: a.float() if a.dtype == torch.float16 else a)


_NARROW_UNSIGNED = (torch.uint16, torch.uint32)


def touches_narrow_unsigned(op: Op) -> bool:
    return any(t.dtype.as_torch() in _NARROW_UNSIGNED for t in (*op.inputs, *op.outputs))


def unsigned_via_int64(kernel: Callable, op: Op) -> Callable:
    """torch has no arithmetic on uint16/uint32 (``seed + 1`` fails), the IPU has: compute in
    int64 and cast back, which wraps modulo 2**16 / 2**32 as the IPU's unsigned ops do."""
    return _computed_wide(kernel, op, lambda a: a.long() if a.dtype in _NARROW_UNSIGNED else a)


def _computed_wide(kernel: Callable, op: Op, widen: Callable) -> Callable:
    """``kernel`` on its arguments widened by ``widen``, results cast back to ``op``'s output
    dtypes (an in-place op's result copied into its target)."""
    out_dtypes = [t.dtype.as_torch() for t in op.outputs]
    target = op.opdef.inplace[0] if op.opdef.inplace else None

    def run(*args):
        res = kernel(*[widen(a) for a in args])
        many = isinstance(res, tuple)
        res = tuple(r.to(d) for r, d in zip(res if many else (res,), out_dtypes))
        if target is not None and res[0].shape != args[target].shape:
            # a layout op in place (BERT's uint32 ``flatten_``): its result is the target
            # seen with another shape, not a value to copy into it; layout needs no widening
            return kernel(*args)
        if target is not None:
            args[target].copy_(res[0])
            res = (args[target], *res[1:])
        return res if many else res[0]

    return run


def cloning(kernel: Callable) -> Callable:
    """A view op's kernel whose result may not alias its input: the result copied, unless
    torch already made a copy (``reshape`` of a transposed tensor: copying it again doubled
    the memory traffic of every attention block's output)."""

    def copied(*args):
        res = kernel(*args)
        if res._base is None and not _shares_storage(res, args):
            return res  # a tensor of its own: torch copied
        return res.clone()

    return copied


def _shares_storage(res: torch.Tensor, args: tuple) -> bool:
    """``res`` is one of ``args`` or uses the storage of one (an alias that is not a view:
    the input itself, ``detach``)."""
    ptr = res.untyped_storage().data_ptr()
    return any(
        a is res or (isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == ptr)
        for a in args
    )
