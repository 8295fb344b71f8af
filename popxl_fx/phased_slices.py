"""Micro-batches in a phased program: ``Options(phased_execution=..., gradient_accumulation=k,
batch_serialisation=s)``.

Seed 003's shape (phased execution with gradient accumulation by hand), for any traced model:
each phase loads its weights once and runs its forward on every slice of the replica's batch
(k micro-batches of s slices each, ``k * s`` slices of consecutive rows, in order); what a later
phase reads and what the phase's own backward needs go to Streaming Memory, one remote-buffer
entry per slice (`SliceStore.keep`), so a phase holds one slice's activations at a time. The
backward phase reloads its weights, then per slice (in the same order) loads the activations
and the gradients of its outputs, runs its gradient graph, mean-accumulates the parameter
gradients on chip (`addons.autodiff_with_accumulation`, accumulators made zero for the phase)
and stores its inputs' gradients for the phase before it; one optimizer update follows.

The numbers are the plain program's with the same options (`step_loops.LoopShape`): the
same slices, each piece's forward and gradient graph on the same values, the gradients
mean-accumulated in slice order, and the loss combined as the plain loops do (each
micro-batch's loss the mean of its slices' losses, the step's the mean of the micro-batches').
With one slice (``k = s = 1``) `SliceStore` keeps values on chip and the phased program is
built as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import popxl_core as popxl
from popxl_core import ops

from .batch_serial import mean_in_order

__all__ = ["Kept", "SliceStore", "Slices"]


@dataclass(frozen=True)
class Slices:
    """How a replica's batch is cut: ``k`` micro-batches (gradient_accumulation) of ``s``
    slices (batch_serialisation) each."""

    k: int = 1
    s: int = 1

    @classmethod
    def of(cls, options) -> Slices:
        return cls(options.gradient_accumulation, options.batch_serialisation)

    @property
    def count(self) -> int:
        return self.k * self.s

    def examples(self, examples: tuple) -> tuple:
        """One slice of one replica's example inputs (what each piece is traced on)."""
        if self.count == 1:
            return examples
        return tuple(x[: x.shape[0] // self.count] for x in examples)

    def envs(self, placeholders: Sequence, tensors: Sequence[popxl.Tensor]) -> list[dict]:
        """Per slice, the traced graph's placeholders bound to that slice of the loaded inputs
        (sliced where first read: `SliceStore.fetch`)."""
        if self.count == 1:
            return [dict(zip(placeholders, tensors))]
        return [
            {p: _Rows(t, j, t.shape[0] // self.count) for p, t in zip(placeholders, tensors)}
            for j in range(self.count)
        ]

    def loss(self, losses: list[popxl.Tensor]) -> popxl.Tensor:
        """The step's loss from the slices' losses, summed and divided as the plain loops do
        (`batch_serial._mean_loss` per micro-batch, then `loops.micro_batch_loop`)."""
        micro = [mean_in_order(losses[i * self.s : (i + 1) * self.s]) for i in range(self.k)]
        return mean_in_order(micro)


@dataclass(frozen=True, eq=False)
class Kept:
    """A value of one slice waiting in Streaming Memory: its buffer and entry."""

    buffer: popxl.RemoteBuffer
    entry: int
    name: str


@dataclass(frozen=True, eq=False)
class _Rows:
    """Rows ``[j * rows, (j + 1) * rows)`` of a loaded input: slice ``j`` of the batch."""

    tensor: popxl.Tensor
    j: int
    rows: int


class SliceStore:
    """Where values wait between the phase that makes them and the one that reads them: on
    chip with one slice, else one remote buffer per value (``count`` entries, one per slice)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._buffers: dict[str, popxl.RemoteBuffer] = {}

    def keep(self, role: str, j: int, t: popxl.Tensor) -> popxl.Tensor | Kept:
        """Store slice ``j``'s value of ``role`` (a name unique to the value across slices);
        returns what `fetch` takes (the tensor itself with one slice)."""
        if self.count == 1:
            return t
        buf = self._buffers.get(role)
        if buf is None:
            buf = self._buffers[role] = popxl.remote_buffer(t.shape, t.dtype, self.count)
        ops.remote_store(buf, j, t)
        return Kept(buf, j, f"{role}.{j}")

    @staticmethod
    def fetch(x):
        """The value on chip: loaded from Streaming Memory, a slice of an input, or ``x``."""
        if isinstance(x, Kept):
            return ops.remote_load(x.buffer, x.entry, x.name)
        if isinstance(x, _Rows):
            start = x.j * x.rows
            return ops.slice(x.tensor, start=start, stop=start + x.rows, axis=0)
        return x
