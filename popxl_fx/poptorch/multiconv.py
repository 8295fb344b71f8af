"""``poptorch.MultiConv``: PopTorch plans the convolutions of its scope as one; here they
compute the same values one by one. Its setters validate as PopTorch's do, and an executor's
trace raises PopTorch's errors for a nested scope or one without a convolution.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from popxl_fx.capture_watch import watching

from . import marks
from .enums import MultiConvPlanType
from .errors import Error

__all__ = ["MultiConv"]

_CONV_FUNCTIONS = frozenset(
    {
        F.conv1d,
        F.conv2d,
        F.conv3d,
        F.conv_transpose1d,
        F.conv_transpose2d,
        F.conv_transpose3d,
        torch.conv1d,
        torch.conv2d,
        torch.conv3d,
        torch.convolution,
    }
)
_OPEN: list[MultiConv] = []  # the scopes open in the trace running now


def _per_conv(what: str, value: Any, kind: type) -> tuple | None:
    """One value for every convolution (a scalar) or one each (a non-empty list/tuple)."""
    if value is None:
        return None
    if isinstance(value, kind):
        return (value,)
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, kind) for v in value):
        return tuple(value)
    raise AssertionError(f"Invalid {what}!")


def _partials(dtype: Any) -> torch.dtype:
    if dtype not in (torch.float32, torch.float16):
        raise ValueError("Invalid partials types. Expecting torch.float or torch.half")
    return dtype


def _is_conv(node, module) -> bool:
    if module is not None:
        return isinstance(module, nn.modules.conv._ConvNd)
    return node.op == "call_function" and node.target in _CONV_FUNCTIONS


class MultiConv:
    """``with poptorch.MultiConv():`` around data-independent convolutions."""

    def __init__(self) -> None:
        self.options: dict[str, Any] = {}
        self._convs = 0
        self._watch: Any = None  # the `watching` context while the scope is open

    def availableMemoryProportions(self, value) -> MultiConv:
        self.options["available_memory_proportions"] = _per_conv(
            "available memory proportion", value, float
        )
        return self

    def partialsTypes(self, value) -> MultiConv:
        values = value if isinstance(value, (list, tuple)) else (value,)
        self.options["partials_types"] = tuple(_partials(v) for v in values)
        return self

    def enableConvDithering(self, value) -> MultiConv:
        if value is not None and not all(
            isinstance(v, bool) for v in (value if isinstance(value, (list, tuple)) else [value])
        ):
            raise ValueError("value must be bool or list of bools")
        self.options["enable_conv_dithering"] = value
        return self

    def planType(self, value) -> MultiConv:
        if value is not None and not isinstance(value, MultiConvPlanType):
            raise AssertionError("Invalid plan type!")
        self.options["plan_type"] = value
        return self

    def perConvReservedTiles(self, value: int) -> MultiConv:
        assert isinstance(value, int)
        self.options["per_conv_reserved_tiles"] = value
        return self

    def cycleBackOff(self, value: float) -> MultiConv:
        assert isinstance(value, float)
        self.options["cycle_back_off"] = value
        return self

    def _saw(self, node, module) -> None:
        self._convs += _is_conv(node, module)

    def __enter__(self) -> MultiConv:
        if marks.current() is None:  # eager torch: nothing is planned
            return self
        if _OPEN:
            raise Error("Nested poptorch.MultiConv is not supported")
        _OPEN.append(self)
        self._convs = 0
        self._watch = watching(self._saw)
        self._watch.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self not in _OPEN:
            return
        _OPEN.remove(self)
        self._watch.__exit__(*exc)
        if exc[0] is None and self._convs == 0:
            # PopTorch's own words: the scope closed with no convolution to combine
            raise Error("Unexpected end_multi_conv: no convolution in the poptorch.MultiConv")
