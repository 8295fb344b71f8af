"""One ATen decomposition per distinct call (`fallback.decompose`): the same call made again,
by another node or another build (dropout's ``torch.rand(h.shape)`` in every block, in every
trainer of a model), is traced once (two ``make_fx`` traces, ~15 ms) and then copied.

Only calls whose trace is a function of the key are shared (`call_key`): a ``call_function``
of torch's own operators and functions (fixed by the torch build; a user's function may read
state, a module has its configuration), and Python's ``operator`` functions, on arguments
keyed by value. A tensor argument is keyed by everything the trace can see of it: type,
dtype, shape, strides, storage offset, its whole storage's bytes (the trace runs the call on
a copy of that storage: data-dependent code and ``as_strided`` read it), conjugate and
negative bits and ``requires_grad``. Torch's state that changes what gets traced is part of
the key too: the default dtype, grad and inference mode, autocast, deterministic algorithms
and the decomposition table. A torch function mode turns the memo off.

What differs per node is not shared: each node gets its own copy of the graph (its nodes'
``meta`` copied), on which the caller marks the node's buffer updates and error locations.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable
from types import BuiltinFunctionType
from typing import Any

import torch
import torch.fx as fx

from popxl_core.ops.aten import fake_key
from popxl_core.ops.fake_memo import typed

__all__ = ["call_key", "traced_once"]

_MEMO: dict[Any, fx.GraphModule] = {}
_LIMIT = 256  # graphs; the memo starts over beyond
_MAX_BYTES = 1 << 16  # a call on more tensor data than this is not kept (its key would be big)


def call_key(node: fx.Node, leaves: list, spec: Any, table: int) -> Any:
    """The key of ``node``'s call on its flattened example arguments (``leaves``, ``spec``)
    with decomposition table ``table``, or None where the call is not shared."""
    if node.op != "call_function" or torch._C._len_torch_function_stack():
        return None
    target = _target_key(node.target)
    if target is None or sum(_nbytes(v) for v in leaves) > _MAX_BYTES:
        return None
    values = tuple(_leaf_key(v) for v in leaves)
    if any(v is None for v in values):
        return None
    return target, spec, values, table, _torch_state()


def _target_key(target: Any) -> Any:
    if isinstance(target, BuiltinFunctionType) and target.__module__ == operator.setitem.__module__:
        return target  # operator.setitem, getitem: Python's syntax for the tensor's methods
    return fake_key(target)


def _nbytes(v: Any) -> int:
    if not isinstance(v, torch.Tensor) or v.layout != torch.strided or v.device.type != "cpu":
        return 0  # (one not on the CPU is not keyed: `_leaf_key`)
    return v.untyped_storage().nbytes()


def _leaf_key(v: Any) -> Any:
    if not isinstance(v, torch.Tensor):
        return typed(v)
    if v.layout != torch.strided or v.device.type != "cpu" or v.is_quantized:
        return None
    flags = (v.is_conj(), v.is_neg(), v.requires_grad)
    layout = (tuple(v.shape), v.stride(), v.storage_offset())
    return type(v), v.dtype, layout, flags, _storage_bytes(v)


def _storage_bytes(v: torch.Tensor) -> bytes:
    """The values of ``v``'s whole storage (conjugate and negative bits resolved: they are
    keyed apart)."""
    whole = v.untyped_storage().nbytes() // max(v.element_size(), 1)
    flat = v.detach().as_strided((whole,), (1,), 0).resolve_conj().resolve_neg()
    return flat.contiguous().view(torch.uint8).numpy().tobytes()


def _torch_state() -> tuple:
    return (
        torch.get_default_dtype(),
        torch.is_grad_enabled(),
        torch.is_inference_mode_enabled(),
        torch.is_autocast_enabled("cpu"),
        torch.are_deterministic_algorithms_enabled(),
    )


def traced_once(key: Any, trace: Callable[[], fx.GraphModule]) -> fx.GraphModule:
    """A copy of ``trace()``'s graph, traced once per ``key`` (every time when None)."""
    if key is None:
        return trace()
    if key not in _MEMO:
        if len(_MEMO) >= _LIMIT:
            _MEMO.clear()
        _MEMO[key] = trace()
    return _copied(_MEMO[key])


def _copied(gm: fx.GraphModule) -> fx.GraphModule:
    """``gm`` with a graph of its own (each node's ``meta`` a copy: the caller marks them);
    the traced constants are shared (lowering only reads them)."""
    graph = copy.deepcopy(gm.graph)
    return fx.GraphModule(gm, graph, class_name=type(gm).__name__)
