"""PopTorch's check that a call's inputs are the ones its program was compiled for.

A PopTorch executor compiles once, for its first call's inputs; a later call whose tensors
have another dtype or shape raises `poptorch.Error` (until ``destroy()``), rather than
compiling again. (A call of another structure, optional arguments given or left out, gets its
own program here: PopTorch binds them to forward's defaults and runs one program.)
"""

from __future__ import annotations

import torch

from .errors import Error

__all__ = ["InputSignature"]

_END = (
    "\nThis error occurred because the inputs passed at runtime don't match the inputs used "
    "to compile the model.\nTo recompile the model for the new inputs create a new "
    "inferenceModel / trainingModel wrapper or call destroy() on the current one and try again."
)


class InputSignature:
    """The structure and each tensor's dtype and shape of the inputs a program was built for."""

    def __init__(self, tensors: list[torch.Tensor], call: tuple) -> None:
        self.call = call
        self.specs = [(t.dtype, t.shape) for t in tensors]

    def check(self, tensors: list[torch.Tensor], call: tuple) -> None:
        """Raise PopTorch's error for the first tensor of these inputs (of the same
        structure) whose dtype or shape differs from ours."""
        if call != self.call:
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
