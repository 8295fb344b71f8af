"""PopTorch's mark on a model that a training executor holds.

`poptorch.trainingModel` changes the class of the user's model to a subclass,
``Poptorch<Name>``, with a ``destroy()`` that destroys the executor. A model so marked cannot be
wrapped again until it is destroyed (PopTorch's RuntimeError), and the executor's `destroy`
gives the model back its own class.

A marked model pickles as its own class (`torch.save` files load without popxl_fx's types);
a shallow copy keeps the mark, through `restore` (PopTorch's ``_restoreWrapperIfNecessary``).
"""

from __future__ import annotations

import copy
import copyreg
import weakref

from torch import nn

from . import state_hooks

__all__ = ["is_wrapped", "restore", "unwrap", "wrap"]

_WRAPPER_TYPES: set[type] = set()
_COPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # plain copy -> its mark


def is_wrapped(model: nn.Module) -> bool:
    return type(model) in _WRAPPER_TYPES


def wrap(model: nn.Module, executor) -> None:
    """Mark ``model`` as held by ``executor`` (weakly: the model does not keep it alive)."""
    if is_wrapped(model):
        raise RuntimeError(
            "Model has already been wrapped in 'poptorch.trainingModel'. Call model.destroy() "
            "on the model to unwrap before wrapping again."
        )
    parent = weakref.ref(executor)
    model.__class__ = _wrapper_type(type(model), parent)
    state_hooks.hook_tensors(model, parent)


def unwrap(model: nn.Module) -> None:
    if is_wrapped(model):
        model.__class__ = type(model).__bases__[0]
        state_hooks.unhook_tensors(model)


def _wrapper_type(base: type, parent: weakref.ref) -> type:
    def destroy(self) -> None:
        """Destroy the model's executor: its program goes, the model keeps its weights."""
        executor = parent()
        if executor is not None:
            executor.destroy()
        unwrap(self)  # also when the executor is gone: nothing holds the model any more

    # the base's module keeps torch.nn's modules leaves of the capture
    namespace = {"destroy": destroy, "__module__": base.__module__}
    namespace.update(state_hooks.model_hooks(parent))  # PopTorch's implicit copies
    wrapper = type(f"Poptorch{base.__name__}", (base,), namespace)
    _WRAPPER_TYPES.add(wrapper)
    copyreg.pickle(wrapper, _reduce)
    return wrapper


def restore(obj):
    """The object with its mark back if it is a copy of a marked model (else as it is)."""
    wrapper = _COPIES.pop(obj, None)
    if wrapper is not None:
        obj.__class__ = wrapper
    return obj


def _reduce(model: nn.Module) -> tuple:
    """Pickle and copy a marked model as a plain one, remembered for `restore`."""
    wrapper = type(model)
    model.__class__ = wrapper.__bases__[0]
    try:
        plain = copy.copy(model)
    finally:
        model.__class__ = wrapper
    _COPIES[plain] = wrapper
    return restore, (plain,)
