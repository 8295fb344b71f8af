"""torch.fx traces that do not patch `nn.Module` once per trace.

torch.fx's ``Tracer.trace`` patches ``nn.Module.__call__`` and ``nn.Module.__getattr__`` when
it starts and puts them back when it ends: four writes of class attributes per trace, and
each makes CPython update the call or getattr slot of every subclass of `nn.Module` (about
800 in a test-suite process: ~1.4 ms a trace, 7 % of the suite's sampled time). Lowering a
model traces it several times (its capture, `check`'s second trace, the outline plan's).

Inside `kept_patches()` (one `lower_stage.lower_module`, `outline.plan_outline` or `check`),
the first capture trace installs two dispatchers on `nn.Module` instead, left in place until
the window closes. While a `capture.CaptureTracer` traces, they are marked as fx's own
patches (so fx writes nothing) and route module calls and attribute reads to that tracer
exactly as fx's ``module_call_wrapper`` and ``module_getattr_wrapper`` do; otherwise they call
what they replaced, and any other tracer (``make_fx``'s) patches as before. As fx's own
patches, they are process-wide: a trace is not expected to run beside other threads' module
calls.

Every `trace` also hands fx one wrapper per builtin function it autowraps (``math``'s), made
once, instead of new ones per trace (`_wrapped_once`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
from typing import Any, Iterator

import torch.fx as fx
import torch.fx._symbolic_trace as fx_trace
from torch import nn

__all__ = ["kept_patches", "trace"]

# the attribute fx's `_Patcher.patch_method` reads to skip a method that is already patched
_MARK = "__fx_already_patched"


@dataclasses.dataclass
class _Window:
    depth: int = 0  # open `kept_patches` windows
    saved: tuple | None = None  # (__call__, __getattr__) the dispatchers replaced
    tracers: list = dataclasses.field(default_factory=list)  # (tracer, parameter proxies)


_WINDOW = _Window()


def _module_call(mod: nn.Module, *args: Any, **kwargs: Any) -> Any:
    assert _WINDOW.saved is not None
    if not _WINDOW.tracers:
        return _WINDOW.saved[0](mod, *args, **kwargs)
    tracer, _ = _WINDOW.tracers[-1]

    def forward(*args: Any, **kwargs: Any) -> Any:
        return fx_trace._orig_module_call(mod, *args, **kwargs)

    fn_globals = getattr(getattr(mod, "forward", mod), "__globals__", {})
    fx_trace._autowrap_check(fx_trace.CURRENT_PATCHER, fn_globals, tracer._autowrap_function_ids)
    return tracer.call_module(mod, forward, args, kwargs)


def _module_getattr(mod: nn.Module, attr: str) -> Any:
    assert _WINDOW.saved is not None
    if not _WINDOW.tracers:
        return _WINDOW.saved[1](mod, attr)
    tracer, proxies = _WINDOW.tracers[-1]
    return tracer.getattr(attr, fx_trace._orig_module_getattr(mod, attr), proxies)


def _mark(on: bool) -> None:
    _module_call.__dict__[_MARK] = on
    _module_getattr.__dict__[_MARK] = on


def _install() -> None:
    if _WINDOW.saved is None:
        _WINDOW.saved = (nn.Module.__dict__["__call__"], nn.Module.__dict__["__getattr__"])
        _mark(False)
        nn.Module.__call__ = _module_call  # type: ignore[method-assign]
        nn.Module.__getattr__ = _module_getattr  # type: ignore[method-assign]


def _uninstall() -> None:
    if _WINDOW.saved is not None:
        nn.Module.__call__, nn.Module.__getattr__ = _WINDOW.saved  # type: ignore[method-assign]
        _WINDOW.saved = None


@contextlib.contextmanager
def kept_patches() -> Iterator[None]:
    """A window in which `trace` patches `nn.Module` once, not once per trace."""
    _WINDOW.depth += 1
    try:
        yield
    finally:
        _WINDOW.depth -= 1
        if _WINDOW.depth == 0:
            _uninstall()


def trace(tracer: fx.Tracer, root: nn.Module) -> fx.Graph:
    """``tracer.trace(root)``; inside `kept_patches`, through the kept dispatchers."""
    with _wrappers_kept():
        if _WINDOW.depth == 0:
            return tracer.trace(root)
        _install()
        _WINDOW.tracers.append((tracer, {}))
        _mark(True)
        try:
            return tracer.trace(root)
        finally:
            _WINDOW.tracers.pop()
            _mark(bool(_WINDOW.tracers))


# Each fx trace wraps every function of ``math`` (its default ``autowrap_modules``) anew:
# ~56 ``functools.wraps`` wrappers, a quarter of a small model's trace. fx's wrapper of a
# function holds nothing of the trace (it finds the tracer through its proxy arguments), and
# a builtin function's name, module and doc, all `functools.wraps` copies, never change: the
# wrapper of a builtin function is made once and handed to every trace.
_FX_WRAP = fx_trace._create_wrapped_func
_WRAPPERS: dict[int, tuple[Any, Any]] = {}  # id(function) -> (function, its fx wrapper)


def _wrapped_once(fn: Any) -> Any:
    if not isinstance(fn, types.BuiltinFunctionType):
        return _FX_WRAP(fn)
    held = _WRAPPERS.get(id(fn))
    if held is None or held[0] is not fn:  # (a function held here keeps its id)
        held = _WRAPPERS[id(fn)] = (fn, _FX_WRAP(fn))
    return held[1]


@contextlib.contextmanager
def _wrappers_kept() -> Iterator[None]:
    """fx's traces use `_wrapped_once` (fx looks ``_create_wrapped_func`` up per call)."""
    before = fx_trace._create_wrapped_func
    fx_trace._create_wrapped_func = _wrapped_once
    try:
        yield
    finally:
        fx_trace._create_wrapped_func = before
