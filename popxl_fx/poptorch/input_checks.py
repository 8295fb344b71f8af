"""PopTorch's check that a call's inputs are the ones its program was compiled for.

A PopTorch executor compiles once, for its first call's inputs; a later call whose tensors
have another dtype or shape raises `poptorch.Error` (until ``destroy()``), rather than
compiling again. A call of another structure is bound to forward's signature as PopTorch
binds it (`binding`) and raises PopTorch's error where it differs from the compiled call.
"""

from __future__ import annotations

import torch

from .binding import Bound, validate
from .errors import Error

__all__ = ["InputSignature"]

_END = (
    "\nThis error occurred because the inputs passed at runtime don't match the inputs used "
    "to compile the model.\nTo recompile the model for the new inputs create a new "
    "inferenceModel / trainingModel wrapper or call destroy() on the current one and try again."
)


class InputSignature:
    """The structure and each tensor's dtype and shape of the inputs a program was built for."""

    def __init__(self, tensors: list[torch.Tensor], call: tuple, bound: Bound) -> None:
        self.call, self.bound = call, bound
        self.specs = [(t.dtype, t.shape) for t in tensors]

    def same_call(self, call: tuple | None) -> bool:
        return call is not None and _same(call, self.call)

    def check(self, tensors: list[torch.Tensor], call: tuple, bound: Bound) -> None:
        """Raise PopTorch's error for a dict argument with other keys, for inputs of another
        structure unlike the compiled ones, or for the first tensor of these inputs (of the
        same structure) whose dtype or shape differs."""
        if not _same(call, self.call):
            _check_keys(self.call[0].children_specs[0], call[0].children_specs[0])
            validate(self.bound, bound, _END)
            return
        for i, (t, (dtype, shape)) in enumerate(zip(tensors, self.specs)):
            if t.dtype != dtype:
                raise Error(
                    f"Data type mismatch for input {i}: expected {dtype} but got {t.dtype}.{_END}"
                )
            if t.shape != shape:
                raise Error(
                    f"Shape mismatch for input {i}: expected {shape} but got {t.shape}.{_END}"
                )


def _same(a: tuple, b: tuple) -> bool:
    try:
        return bool(a == b)
    except RuntimeError:  # a non-tensor value holding tensors: not comparable, so changed
        return False


def _check_keys(compiled, given) -> None:
    """PopTorch's error for a dict among the positional arguments whose keys changed."""
    if compiled.type is not given.type:
        return
    is_dict = isinstance(compiled.type, type) and issubclass(compiled.type, dict)
    if is_dict and set(compiled.context) != set(given.context):
        missing = sorted(set(compiled.context) - set(given.context))
        extra = sorted(set(given.context) - set(compiled.context))
        details = [f"Unexpected arguments: {', '.join(map(str, extra))}"] if extra else []
        details += [f"Missing arguments: {', '.join(map(str, missing))}"] if missing else []
        raise Error(f"Keys mismatch: {'. '.join(details)}.{_END}")
    if len(compiled.children_specs) == len(given.children_specs):
        for c, g in zip(compiled.children_specs, given.children_specs):
            _check_keys(c, g)
