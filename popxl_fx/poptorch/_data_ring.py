"""The shared-memory ring between `AsynchronousDataAccessor` and its worker process.

Each slot holds one element of the data set, flattened to its tensors. The worker writes a
slot and then raises its ``ready`` flag; the host reads it, hands the tensors to the user
(they are views of the shared memory, as PopTorch's are) and lowers the flag when the next
element is asked for. ``rows`` says what a ready slot holds: ``FULL``, a partial batch of that
many rows (a rebatched remainder), or ``END``, the end of one pass over the data set.

The structure of an element (a tensor, tuple, list, dict or a type with a registered
`poptorch.ICustomArgParser`) travels once as a template whose tensors are empty placeholders.
"""

from __future__ import annotations

from typing import Any

import torch

from .args import parser_for
from .errors import Error

__all__ = ["END", "FULL", "Ring", "leaves", "rebuild", "template_of"]

FULL, END = -1, -2


class Ring:
    """``slots`` shared buffers per tensor of an element, with their flags."""

    def __init__(self, ready: torch.Tensor, rows: torch.Tensor, buffers: list) -> None:
        self.ready, self.rows, self.buffers = ready, rows, buffers

    @classmethod
    def allocate(cls, slots: int, first: list[torch.Tensor], rebatch: int | None) -> Ring:
        """Shared buffers shaped like ``first`` (``rebatch`` rows each when rebatching)."""
        shapes = [t.shape if rebatch is None else (rebatch, *t.shape[1:]) for t in first]
        buffers = [
            torch.zeros((slots, *shape), dtype=t.dtype).share_memory_()
            for shape, t in zip(shapes, first)
        ]
        ready = torch.zeros(slots, dtype=torch.bool).share_memory_()
        return cls(ready, torch.full((slots,), FULL, dtype=torch.int64).share_memory_(), buffers)

    @property
    def indices_mem(self) -> torch.Tensor:
        """The ready flags, under PopTorch's name."""
        return self.ready

    @property
    def slots(self) -> int:
        return len(self.ready)

    def parts(self) -> tuple:
        return self.ready, self.rows, self.buffers

    def read(self, slot: int) -> list[torch.Tensor]:
        """The tensors of a ready slot: views of the shared memory."""
        rows = int(self.rows[slot])
        views = [b[slot] for b in self.buffers]
        return views if rows == FULL else [v.narrow(0, 0, rows) for v in views]

    def write(self, slot: int, tensors: list[torch.Tensor], rows: int = FULL) -> None:
        """Fill ``slot`` (its first ``rows`` rows when given) and mark it ready."""
        for buffer, tensor in zip(self.buffers, tensors):
            target = buffer[slot] if rows == FULL else buffer[slot].narrow(0, 0, rows)
            if target.shape != tensor.shape:
                raise Error(
                    f"AsynchronousDataAccessor: an element has a tensor of shape "
                    f"{tuple(tensor.shape)} where the first had {tuple(target.shape)}; every "
                    "element must have the same shapes (use drop_last=True or "
                    "DataLoaderMode.AsyncRebatched for a partial last batch)."
                )
            target.copy_(tensor)
        self.mark(slot, rows)

    def mark(self, slot: int, rows: int) -> None:
        # the flag goes up last: the reader trusts the slot's contents once it sees it
        self.rows[slot] = rows
        self.ready[slot] = True


def leaves(value: Any) -> list[torch.Tensor]:
    """The tensors of one element, in a fixed order."""
    parser = parser_for(value)
    if parser is not None:
        return list(parser.yieldTensors(value))
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in leaves(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in leaves(v)]
    raise Error(
        f"AsynchronousDataAccessor expects elements made of tensors (in tuples, lists, dicts "
        f"or registered custom types), got a {type(value).__name__}."
    )


def rebuild(template: Any, tensors) -> Any:
    """``template`` with its tensors taken, in order, from the iterator ``tensors``."""
    parser = parser_for(template)
    if parser is not None:
        return parser.reconstruct(template, tensors)
    if isinstance(template, torch.Tensor):
        return next(tensors)
    if isinstance(template, dict):
        return type(template)((k, rebuild(v, tensors)) for k, v in template.items())
    if isinstance(template, tuple) and hasattr(template, "_fields"):  # a namedtuple
        return type(template)(*(rebuild(v, tensors) for v in template))
    return type(template)(rebuild(v, tensors) for v in template)


def template_of(value: Any) -> Any:
    """``value`` with empty placeholders for its tensors (cheap to send to the host)."""
    return rebuild(value, iter([torch.empty(0, dtype=t.dtype) for t in leaves(value)]))
