"""The capture tracer's calls into user code: the root ``forward`` and modules made on the fly.

- The root ``forward`` is called with the example inputs bound by a `calls.Binding`
  (positional, keyword, constants): one placeholder per input tensor and nothing else, so
  parameters left out keep their defaults, ``**kwargs`` stays empty and ``forward(*args)``
  gets its tensors one by one (fx's own root arguments would make a placeholder for each
  parameter, ``*args`` and ``**kwargs`` included).
- What it returns is recorded as a pytree structure (`calls.flat_outputs`): dataclasses and
  HuggingFace ``ModelOutput``s come back as such from the entry points; a value that is not a
  tensor (a KV cache object) is reported.
- ``x[index] = value`` becomes ``x = setitem(x, index, value)``, a new tensor (the proxy
  is rebound to it) that the lowering driver treats as an in-place update of ``x``: written
  back into the tensors ``x`` is a view of, a buffer or a model input (`popxl_fx.inplace`,
  `popxl_fx.view_writes`).
- Slice bounds that are one-element integer tensors held by the model (``x[t:t + 2]``) are
  read as ints at capture, as eager's ``__index__`` reads them (`static_index`).
- A module that is not a submodule of the model (``nn.ReLU()(x)`` in ``forward``, a
  module-level activation, ``CrossEntropyLoss()`` built in a loss) is traced through, its ops
  belonging to the module that called it; one holding parameters is reported, since its
  weights are not the model's.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx
from torch import nn

from .calls import POSITIONAL, Binding, flat_outputs
from .errors import StackPart, stack_part
from .inplace import setitem

__all__ = ["RootCalls", "setitem", "static_index"]

_CACHE_HINT = (
    "a static program returns tensors only; HuggingFace models return their KV cache "
    "unless called with use_cache=False (e.g. trainer(ids, labels=ids, use_cache=False), "
    "or model.config.use_cache = False): caches are for generation."
)


def _static_bound(b: Any) -> Any:
    if isinstance(b, torch.Tensor) and b.numel() == 1 and not b.is_floating_point():
        return int(b)  # what eager's __index__ reads, once: a constant of the capture
    return b


def static_index(index: Any) -> Any:
    """``index`` with slice bounds that are one-element integer tensors held by the model
    (not traced values) as ints, as eager's ``x[t:t + 2]`` reads them."""
    if isinstance(index, tuple):
        return tuple(static_index(i) for i in index)
    if isinstance(index, slice):
        return slice(*(_static_bound(b) for b in (index.start, index.stop, index.step)))
    return index


if TYPE_CHECKING:  # the mixin's methods call fx.Tracer's (CaptureTracer's other base)
    from torch.fx import Tracer as _TracerBase
else:
    _TracerBase = object


class RootCalls(_TracerBase):
    """Mixin of `capture.CaptureTracer` (see the module docstring)."""

    _inputs: list  # CaptureTracer's example inputs

    if TYPE_CHECKING:  # pragma: no cover (CaptureTracer's method)

        def record(self, node: fx.Node | None, kind: str, what: str, hint: str = "") -> None: ...

    binding: Binding = POSITIONAL
    out_spec: Any = None  # the pytree structure of what the root forward returned
    # while forward runs: the root call's frame and the `errors.StackPart` from it out
    stack_outside: tuple[FrameType, StackPart] | None = None

    def create_args_for_root(
        self, root_fn: Callable, is_module: bool, concrete_args: Any = None
    ) -> tuple[Callable, list]:
        if not is_module or concrete_args is not None:
            return super().create_args_for_root(root_fn, is_module, concrete_args)
        names = self.binding.names(root_fn, len(self._inputs))
        proxies = [self.create_proxy("placeholder", name, (), {}) for name in names]

        own = vars(self.root).get("forward")  # a forward set on the instance (nn.Module())

        def root_call(root: nn.Module, *xs: Any) -> Any:
            fn = own if own is not None else functools.partial(root_fn, root)
            # the frames from here out wait while forward runs: each node's stack reads
            # them once (`errors.stack_part`)
            anchor = sys._getframe(0)
            self.stack_outside = anchor, stack_part(anchor)
            try:
                return self._root_outputs(self.binding.call(fn, *xs))
            finally:
                self.stack_outside = None

        return root_call, [self.root, *proxies]

    def _root_outputs(self, out: Any) -> Any:
        fx_out, self.out_spec, bad = flat_outputs(out)
        for path, type_name in bad:
            self.record(None, "non-tensor output", f"forward returns a {type_name} at {path}",
                        _CACHE_HINT)  # fmt: skip
        return fx_out

    # item assignment ------------------------------------------------------------------------
    def assign_item(self, proxy: fx.Proxy, index: Any, value: Any) -> None:
        """``proxy[index] = value``, captured as a new tensor that ``proxy`` then stands for
        (an in-place update of ``proxy``'s tensor: see `popxl_fx.inplace`)."""
        proxy.node = self.create_proxy("call_function", setitem, (proxy, index, value), {}).node

    # modules made during forward -----------------------------------------------------------
    def installed_path(self, m: nn.Module) -> str | None:
        """The module's qualified name in the model, or None when it is not a submodule."""
        try:
            return self.path_of_module(m)
        except NameError:
            return None

    def adopt(self, m: nn.Module, forward: Callable, args: tuple, kwargs: dict) -> Any:
        """Trace through a module that is not a submodule of the model."""
        weights = [n for n, p in m.named_parameters() if p.requires_grad]
        if weights:
            self.record(
                None,
                "module made during forward",
                f"{type(m).__name__} is not a submodule of the model and holds the "
                f"parameter '{weights[0]}'",
                "its weights would be new ones at every call and are not trained; create it "
                "in __init__ (self.layer = ...) so that it is part of the model.",
            )
        return forward(*args, **kwargs)
