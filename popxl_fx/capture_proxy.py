"""The proxy of a captured node: it answers shape questions, len, iter and int from the
node's example value, and reports numpy and .item() reads as issues.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx as fx

from .capture_effects import NUMPY

__all__ = ["FOLDED_ATTRS", "CaptureProxy", "describe"]

# Tensor attributes and methods whose result only depends on the shape/dtype: folded.
FOLDED_ATTRS = frozenset(
    {
        "shape",
        "ndim",
        "dtype",
        "device",
        "is_cuda",
        "layout",
        "requires_grad",
        "is_sparse",
        "is_quantized",
        "is_meta",
    }
)


class CaptureProxy(fx.Proxy):
    """A proxy that answers shape questions and len/iter/int from the example value."""

    def __getattr__(self, k: str) -> Any:
        value = self.node.meta.get("example_value")
        if k in FOLDED_ATTRS and isinstance(value, torch.Tensor):
            return getattr(value, k)
        if k.startswith("__array"):  # numpy probing for its protocols: only __array__ is ours
            raise AttributeError(k)
        if isinstance(value, torch.Tensor) and not hasattr(value, k):
            # duck-typing probes (`hasattr(x, "jax")` in transformers' is_tracing) answer as
            # in eager: a lazy attribute proxy would say yes and trace a call eager never makes
            raise AttributeError(f"{type(value).__name__!r} object has no attribute {k!r}")
        return super().__getattr__(k)

    def _as_numpy(self, what: str) -> Any:
        """numpy on a tensor: reported, then the example's value, so the trace goes on."""
        self.tracer.record(self.node, NUMPY, f"{what} of {describe(self.node)}", _NUMPY_HINT)
        value = self.node.meta["example_value"]
        return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value

    def numpy(self, *args: Any, **kwargs: Any) -> Any:
        return self._as_numpy("Tensor.numpy()")

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        array = self._as_numpy("a numpy function (np.asarray/np.<fn>)")
        return array.astype(dtype) if dtype is not None else array

    def __len__(self) -> int:
        self.tracer.check_static(self, "data-dependent length", "len()")
        return len(self.node.meta["example_value"])

    def __iter__(self) -> Iterator[fx.Proxy]:
        return self.tracer.iter(self)

    def __setitem__(self, index: Any, value: Any) -> None:
        self.tracer.assign_item(self, index, value)  # a new tensor (`capture_calls`)

    def _scalar(self, kind: type) -> Any:
        self.tracer.record(
            self.node,
            ".item()",
            f"{kind.__name__}() of a tensor value",
            "the value depends on the data; keep it a tensor.",
        )
        return kind(self.node.meta["example_value"])

    def __int__(self) -> int:
        return self._scalar(int)

    def __float__(self) -> float:
        return self._scalar(float)

    def __index__(self) -> int:
        return self._scalar(int)


def _inplace_operator(op: Any) -> Any:
    def method(self: CaptureProxy, other: Any) -> Any:
        # ``x += y`` updates x's tensor in place, as eager does (fx's plain Proxy would
        # record ``x = x + y``, leaving a model input or a view's base unchanged)
        return self.tracer.create_proxy("call_function", op, (self, other), {})

    return method


for _op in ("iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow", "iand", "ior",
            "ixor", "ilshift", "irshift"):  # fmt: skip
    setattr(CaptureProxy, f"__{_op}__", _inplace_operator(getattr(operator, _op)))


_NUMPY_HINT = (
    "numpy runs once, at capture, on the example's values: its result would be frozen into "
    "the program as a constant; use torch ops in forward."
)


def describe(node: fx.Node) -> str:
    if node.op == "call_method":
        return f"Tensor.{node.target}()"
    if node.op == "call_function":
        return f"{getattr(node.target, '__name__', node.target)}()"
    return node.name
