"""PopTorch's implicit ``copyWeightsToHost``: reading a trained model's weights on the host
first copies them from the device, once per training call.

A training executor hooks its model as PopTorch does (``_poplar_executor.py``): the model's
class (`wrapping`) copies when ``_parameters``, ``_buffers`` or ``forward`` are read (so
``model.parameters()``, ``state_dict()`` and an eager call see the trained values), and each
parameter and buffer gets a class of its own whose attribute reads copy (``w.data``,
``str(w)``, ``torch.equal(w, x)``: torch looks up ``__torch_function__`` on the tensor). Each
hook asks the executor (weakly held), whose ``copyWeightsToHostIfNeeded`` copies only when a
call ran since the last copy and it is not itself building or running.
"""

from __future__ import annotations

import copyreg
import weakref

import torch
from torch import nn

from .device_copy import HOOKED_TYPES, plain_type

__all__ = ["hook_tensors", "model_hooks", "unhook_tensors"]

_PLAIN_TORCH_FUNCTION = torch._C._disabled_torch_function_impl


def _copy_if_needed(parent: weakref.ref) -> None:
    executor = parent()
    if executor is not None:
        executor.copyWeightsToHostIfNeeded()


def _hooked_type(base: type, parent: weakref.ref) -> type:
    """``base`` whose attribute reads copy the weights to the host first. Its torch functions
    return plain tensors (``base``'s own results)."""

    def __getattribute__(self, name):
        _copy_if_needed(parent)
        return object.__getattribute__(self, name)

    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return _PLAIN_TORCH_FUNCTION(func, types, args, kwargs or {})

    def __repr__(self, *args, **kwargs):
        _copy_if_needed(parent)
        return _as_plain(self, base.__repr__, *args, **kwargs)

    def __deepcopy__(self, memo):
        _copy_if_needed(parent)
        return _as_plain(self, base.__deepcopy__, memo)

    namespace = {
        "__repr__": __repr__,
        "__deepcopy__": __deepcopy__,
        "__getattribute__": __getattribute__,
        "__torch_function__": classmethod(__torch_function__),
        "__module__": base.__module__,
    }
    hooked = type(base.__name__, (base,), namespace)
    HOOKED_TYPES[hooked] = base
    copyreg.pickle(hooked, _reduce_plain)
    return hooked


def _as_plain(t: torch.Tensor, method, *args, **kwargs):
    """``method(t, ...)`` with ``t`` in its plain class for the call."""
    hooked = type(t)
    t.__class__ = HOOKED_TYPES[hooked]
    try:
        return method(t, *args, **kwargs)
    finally:
        t.__class__ = hooked


def _reduce_plain(t: torch.Tensor) -> tuple:
    """Pickle a hooked tensor as its plain class (``torch.save`` files load without it)."""
    return _as_plain(t, type(t).__reduce_ex__, 4)


def hook_tensors(model: nn.Module, parent: weakref.ref) -> None:
    """Give ``model``'s parameters and buffers (of torch's own classes) the hooked classes."""
    hooked: dict[type, type] = {}
    tensors = [*model.parameters(), *model.buffers()]
    for t in tensors:
        base = type(t)
        if base in (nn.Parameter, torch.Tensor):
            if base not in hooked:
                hooked[base] = _hooked_type(base, parent)
            t.__class__ = hooked[base]


def unhook_tensors(model: nn.Module) -> None:
    for t in [*model.parameters(), *model.buffers()]:
        t.__class__ = plain_type(type(t))


def model_hooks(parent: weakref.ref) -> dict:
    """The methods of a training model's class (`wrapping`) that copy before a read."""

    def copyWeightsToHostIfNeeded(self) -> bool:
        """Copy the weights from the device if a training call ran since the last copy."""
        executor = parent()
        return executor.copyWeightsToHostIfNeeded() if executor is not None else False

    def __getattribute__(self, name):
        if name in ("_buffers", "_parameters", "forward"):
            _copy_if_needed(parent)
        return object.__getattribute__(self, name)

    def __getattr__(self, name):
        attribute = super(type(self), self).__getattr__(name)
        if isinstance(attribute, nn.Parameter):
            _copy_if_needed(parent)
        return attribute

    def host_weights_version(self) -> int:
        executor = parent()
        return executor._host_weights_version if executor is not None else 0

    return {
        "_host_weights_version": property(host_weights_version),
        "copyWeightsToHostIfNeeded": copyWeightsToHostIfNeeded,
        "__getattribute__": __getattribute__,
        "__getattr__": __getattr__,
    }
