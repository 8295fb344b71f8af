"""What a model's forward marks while it runs under an executor: its losses
(`identity_loss`) and the blocks it enters (`Block`, `BeginBlock`).

The executor opens a `Marks` around each forward it traces; the functions record into the
innermost one. Outside an executor nothing is recorded and the functions just compute.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["Marks", "current", "recording"]


@dataclass
class Marks:
    losses: list = field(default_factory=list)  # identity_loss results, in call order
    blocks: list = field(default_factory=list)  # (user_id, ipu_id) of each block entered
    overlap_outputs: list = field(default_factory=list)  # set_overlap_for_output's tensors
    training: bool = False  # a trainingModel's forward (for_loop and cond refuse it)
    # a `Block` scope has ended and no block has started since (PopART: no active IPU)
    outside_block: bool = False


_STACK: list[Marks] = []


def current() -> Marks | None:
    """The innermost recording (None outside an executor's forward)."""
    return _STACK[-1] if _STACK else None


@contextlib.contextmanager
def recording(training: bool = False) -> Iterator[Marks]:
    marks = Marks(training=training)
    _STACK.append(marks)
    try:
        yield marks
    finally:
        _STACK.remove(marks)
