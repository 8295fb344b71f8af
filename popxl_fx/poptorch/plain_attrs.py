"""PopTorch's plain tensor attributes: constants of the traced program.

A tensor held as a plain attribute of a module (``self.x = torch.tensor(...)``, not a
parameter or buffer) is not the device's state in PopTorch: its tracer reads it as a
constant, and what ``forward`` writes into it (``self.x += 1``) is not kept for the next call.
popxl_fx's own entry points refuse such a write (eager would keep it); an executor traces its
model with each plain tensor replaced by a copy, so the forward's writes land in the copy and
the program computes them from the constant on every call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

__all__ = ["plain_constants"]


@contextlib.contextmanager
def plain_constants(model: nn.Module) -> Iterator[None]:
    """While open, ``model``'s plain tensor attributes are copies; the originals come back."""
    state = {id(t) for t in (*model.parameters(), *model.buffers())}
    swapped = []
    for module in model.modules():
        for name, value in list(vars(module).items()):
            if isinstance(value, torch.Tensor) and id(value) not in state:
                swapped.append((module, name, value))
                module.__dict__[name] = value.clone()
    try:
        yield
    finally:
        for module, name, value in swapped:
            module.__dict__[name] = value
