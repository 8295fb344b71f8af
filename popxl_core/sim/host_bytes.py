"""The host memory a Session holds, counted by storage: each host buffer, device value and
remote buffer once, however many arrays and tensors view it.

A memory claim is tested on these counts (not on the process's resident memory): a
framework whose tensors are the Session's values (`Session.share_variable_storage`) checks
that the Session holds no second copy of them.
"""

from __future__ import annotations

import gc
import types
from typing import Dict, Iterator, Tuple, Union

import numpy as np
import torch

__all__ = ["held_storages", "reachable_storages", "storage_key"]


def storage_key(x: Union[np.ndarray, torch.Tensor]) -> Tuple[int, int]:
    """``(address, bytes)`` of the whole allocation ``x`` views (a numpy array made from a
    torch tensor is keyed by the tensor's storage)."""
    if isinstance(x, torch.Tensor):
        s = x.untyped_storage()
        return s.data_ptr(), s.nbytes()
    root = x
    while isinstance(root.base, np.ndarray):
        root = root.base
    if isinstance(root.base, torch.Tensor):
        return storage_key(root.base)
    return root.__array_interface__["data"][0], root.nbytes


def _values(session) -> Iterator[Union[np.ndarray, torch.Tensor]]:
    yield from session._host.values()
    yield from session._per_replica.values()
    for values in (session._device or {}).values():
        yield from (t for t in values if t is not None)
    for values in session._runtime.remote.values():
        yield from values or ()  # None: a buffer not made yet (`RemoteState.allocate`)


def held_storages(session) -> Dict[int, int]:
    """``address -> bytes`` of every allocation holding the Session's host buffers, device
    values and Streaming Memory (its own, and those it shares with a framework's tensors)."""
    return dict(storage_key(x) for x in _values(session))


# not followed: a module or class is shared by every Session (a function's globals are its
# module's, unless they are a compiled program's namespace, which the program holds anyway)
_SHARED = (type, types.ModuleType, types.FrameType)


def _referents(obj) -> list:
    if isinstance(obj, types.FunctionType):
        return [obj.__closure__, obj.__defaults__, obj.__kwdefaults__, obj.__dict__]
    return gc.get_referents(obj)


def reachable_storages(root) -> Dict[int, int]:
    """``address -> bytes`` of every torch storage (and numpy buffer) reachable from ``root``
    through containers, objects, closures and partials: what an object keeps alive, whatever
    keeps it (a kernel's buffer kept between runs as well as the Session's values).

    Example: ``reachable_storages([torch.zeros(4)])`` has one entry of 16 bytes; a meta
    tensor has none."""
    seen: set = set()
    out: Dict[int, int] = {}
    todo = [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or obj is None or isinstance(obj, _SHARED):
            continue
        seen.add(id(obj))
        if isinstance(obj, (torch.Tensor, np.ndarray)):
            address, n = storage_key(obj)
            if address:  # 0: no allocation (a meta or fake tensor holds no data)
                out[address] = max(n, out.get(address, 0))
        todo.extend(_referents(obj))
    return out
