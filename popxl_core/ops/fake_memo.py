"""A memo of what the Aten ops' shape rules learn on fake tensors (`aten._infer`,
`aten._differentiable_outputs`): one `FakeTensorMode` run costs ~0.1 ms, and a model's
repeated blocks ask the same question of the same operator once per block and build.

Only calls whose answer is a function of the key are memoised (`aten.fake_key` says which):
an ATen operator of torch's own ``aten`` namespace (its fake kernel and autograd formula are
fixed by the torch build), its Python arguments compared by type and value (`typed`), and
the inputs' shapes and dtypes (the fake inputs are made from nothing else).
"""

from __future__ import annotations

from typing import Any, Callable, Dict

import torch

__all__ = ["memo", "typed"]

# argument types whose value is all an operator sees of them (hashable, immutable)
_PLAIN = (
    int,
    bool,
    str,
    type(None),
    type(Ellipsis),
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
)

_MEMO: Dict[Any, Any] = {}
_LIMIT = 1 << 14  # entries; the memo starts over beyond (a suite builds a few thousand)


def typed(value: Any) -> Any:
    """``value`` as a key that tells apart what Python's ``==`` does not (``1``, ``1.0``,
    ``True``; ``0.0``, ``-0.0``), or None (a tensor, an object of unknown kind)."""
    kind = type(value)
    if kind is tuple:
        items = tuple(typed(v) for v in value)
        return None if any(v is None for v in items) else (tuple, items)
    if kind is slice:  # a subscript's
        parts = typed((value.start, value.stop, value.step))
        return None if parts is None else (slice, parts)
    if kind in (float, complex):
        return (kind, repr(value))  # repr keeps the sign of zero and tells nan from inf
    if kind in _PLAIN:
        return (kind, value)
    return _typed_frozen(value)


def _typed_frozen(value: Any) -> Any:
    """A frozen dataclass (the ops' `Slot`) keyed by its class and its fields' keys."""
    params = getattr(type(value), "__dataclass_params__", None)
    if params is None or not params.frozen:
        return None
    fields = typed(tuple(getattr(value, f) for f in type(value).__dataclass_fields__))
    return None if fields is None else (type(value), fields)


def memo(key: Any, compute: Callable[[], Any]) -> Any:
    """``compute()``'s answer for ``key``, computed once (a failure is not kept: it raises
    again next time). The answer must be immutable: every caller shares it."""
    try:
        return _MEMO[key]
    except KeyError:
        pass
    value = compute()
    if len(_MEMO) >= _LIMIT:
        _MEMO.clear()
    _MEMO[key] = value
    return value
