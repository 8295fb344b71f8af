"""The methods every IR tensor has that are one op each: shape methods and operators.

A mixin of `popxl_core.tensor.Tensor`, apart from the tensor's identity and spec (tensor.py);
each method builds its op in the current graph (``t + 1`` is ``ops.add(t, constant(1))``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:  # pragma: no cover
    from .tensor import Tensor

__all__ = ["TensorMethods"]


def _binary(op: str, reflected: bool = False) -> Callable[[Any, Any], Any]:
    """The Tensor method for a binary operator: ``ops.<op>(self, other)``, or
    ``ops.<op>(other, self)`` for the reflected one (``__radd__``, ...)."""

    def operator(self, other):
        lhs, rhs = self, self._ensure_tensor(other)
        return getattr(_ops(), op)(*((rhs, lhs) if reflected else (lhs, rhs)))

    return operator


class TensorMethods:
    """`Tensor`'s shape methods and operators (popxl.Tensor's names and signatures)."""

    if TYPE_CHECKING:  # pragma: no cover (Tensor's method)

        def _ensure_tensor(self, value, dtype=None) -> "Tensor": ...

    def transpose(self, permutation=None) -> "Tensor":
        return _ops().transpose(self, permutation)

    def transpose_(self, permutation=None) -> "Tensor":
        return _ops().transpose_(self, permutation)

    @property
    def T(self) -> "Tensor":
        return self.transpose()

    @property
    def T_(self) -> "Tensor":
        return self.transpose_()

    def reshape(self, shape) -> "Tensor":
        return _ops().reshape(self, shape)

    def reshape_(self, shape) -> "Tensor":
        return _ops().reshape_(self, shape)

    def flatten(self) -> "Tensor":
        return _ops().flatten(self)

    def flatten_(self) -> "Tensor":
        return _ops().flatten_(self)

    def detach(self) -> "Tensor":
        return _ops().detach(self)

    def detach_(self) -> "Tensor":
        return _ops().detach_(self)

    def copy_to_ipu(self, destination: int, source: Optional[int] = None) -> "Tensor":
        return _ops().ipu_copy(self, destination, source)

    # dunders: a Python operand becomes a constant of the tensor's dtype (`scalar_operand`)
    __add__ = _binary("add")
    __radd__ = _binary("add", reflected=True)

    def __iadd__(self, other: Any) -> Any:
        _ops().add_(self, self._ensure_tensor(other))
        return self

    __sub__ = _binary("sub")
    __rsub__ = _binary("sub", reflected=True)
    __mul__ = _binary("mul")
    __rmul__ = _binary("mul", reflected=True)
    __truediv__ = _binary("div")
    __rtruediv__ = _binary("div", reflected=True)
    __mod__ = _binary("fmod")
    __rmod__ = _binary("fmod", reflected=True)
    __pow__ = _binary("pow")
    __rpow__ = _binary("pow", reflected=True)
    __matmul__ = _binary("matmul")
    __rmatmul__ = _binary("matmul", reflected=True)
    __and__ = _binary("logical_and")
    __rand__ = _binary("logical_and", reflected=True)
    __or__ = _binary("logical_or")
    __ror__ = _binary("logical_or", reflected=True)

    def __neg__(self):
        return _ops().negate(self)

    def __invert__(self):
        return _ops().logical_not(self)

    def __getitem__(self, key):
        from .ops.indexing import getitem

        return getitem(self, key)


def _ops():
    from . import ops

    return ops
