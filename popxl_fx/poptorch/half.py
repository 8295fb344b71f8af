"""PopTorch's mixed-precision rule for parameters (its user guide, "16-bit float support"):
an op called with ``float16`` activations and ``float32`` parameters converts the parameters
to ``float16`` and runs in ``float16``; ``float32`` activations with ``float16`` parameters
run in ``float32``. Activations of both types mix as torch promotes them (half + float is
float): only parameters follow.

Eager torch raises on such calls (``F.linear(half, float weight)``), so the executor traces
its model under `ParamsFollowActivations`: a call whose floating activations share one dtype
gets its floating parameters of another dtype cast to it (a ``.to`` node in the graph, whose
gradient casts back: the optimizer updates the parameters in their own dtype, PopTorch's
"master weights"). Leaf modules that own such parameters (linear, convolutions) are traced
through to their functional call, so the rule sees the parameters there.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch import nn

__all__ = ["ParamsFollowActivations"]

# leaf modules whose forward is one functional call on their own parameters
_THROUGH = (nn.Linear, nn.Bilinear, nn.modules.conv._ConvNd, nn.PReLU)


def _value(x):
    return x.node.meta.get("example_value") if isinstance(x, fx.Proxy) else x


def _is_param(x) -> bool:
    return isinstance(x, fx.Proxy) and isinstance(_value(x), nn.Parameter)


def _floating(x) -> bool:
    value = _value(x)
    return isinstance(value, torch.Tensor) and value.is_floating_point()


def _activation_dtype(leaves: list) -> torch.dtype | None:
    """The one floating dtype of the call's activations (None: none, or several)."""
    dtypes = {_value(x).dtype for x in leaves if _floating(x) and not _is_param(x)}
    return dtypes.pop() if len(dtypes) == 1 else None


class ParamsFollowActivations:
    """The `popxl_fx.capture_watch.Rule` of PopTorch's parameter casting (module docstring)."""

    def call_args(self, tracer: fx.Tracer, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        dtype = _activation_dtype(pytree.tree_leaves((args, kwargs)))
        if dtype is None:
            return args, kwargs

        def follow(x):
            if _is_param(x) and _floating(x) and _value(x).dtype != dtype:
                return tracer.create_proxy("call_method", "to", (x, dtype), {})
            return x

        return pytree.tree_map(follow, (args, kwargs))

    def trace_through(self, module: nn.Module, args: tuple, kwargs: dict) -> Callable | None:
        if not isinstance(module, _THROUGH):
            return None
        dtype = _activation_dtype(pytree.tree_leaves((args, kwargs)))
        own = [p for p in module.parameters(recurse=False) if p.is_floating_point()]
        return _own_code if dtype is not None and any(p.dtype != dtype for p in own) else None


def _own_code(forward: Callable, *args, **kwargs):
    return forward(*args, **kwargs)
