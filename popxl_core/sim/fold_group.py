"""A folded run's group of consecutive all-reduces (`fold_reduce.reduce_group`) in buffers
kept between runs.

The group sums every value's replicas side by side: ``(R, n)`` rows, one ``torch.sum`` over
the replica dim into ``(n,)``, each result a view of that total. Made fresh each run, the
53 result views of GPT's step (a ``split`` and a ``view`` each) cost more than the sum
itself (~140 us of a ~4.5 ms R=4 step, measured in the step: its objects are out of the
cache by then). Where the main graph runs once a run, every value the run computes is dead
when it returns (`variants.py`: runs return copies, variables are written in place), so the
rows and the total can be kept, and the result views made once: each run writes the rows
(one ``cat`` into them), sums into the total and returns the same views. Values made at the
group (`fold_together.py`) take columns after the others: blocks the ``cat`` copies, then
columns their kernels write themselves (`dest`). Each column is summed alone, so the order
of the columns leaves every result's bits as `fold_reduce._flat` makes them.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import torch

from ..ops.collectives.collectives import summed
from .bits import same_bits, same_outputs

__all__ = ["KeptGroup"]


class KeptGroup:
    """One group's rows, total and result views, made at its first reduction from its
    values (each ``(R * rows, ...)``); ``blocks``: per block of columns after the others,
    the positions of the values it holds, in order (`reduce` is given the blocks' values);
    ``into``: the positions whose values are written into their rows (`dest`) before
    `reduce`."""

    def __init__(
        self,
        values: Sequence[torch.Tensor],
        replicas: int,
        blocks: Sequence[Sequence[int]],
        into: Sequence[int],
    ) -> None:
        self.replicas = replicas
        placed = {p for block in blocks for p in block} | set(into)
        self.order = [p for p in range(len(values)) if p not in placed]
        sizes = [v.numel() // replicas for v in values]
        self.columns = [*self.order, *(p for block in blocks for p in block), *into]
        offsets, n = {}, 0
        for p in self.columns:
            offsets[p], n = n, n + sizes[p]
        copied = n - sum(sizes[p] for p in into)
        like = values[0]
        self.rows = torch.empty((replicas, n), dtype=like.dtype)
        self.copied = self.rows[:, :copied]  # the columns the ``cat`` writes
        self.total = torch.empty((n,), dtype=like.dtype)
        shapes = [(v.shape[0] // replicas, *v.shape[1:]) for v in values]
        self.results = [
            self.total[offsets[p] : offsets[p] + sizes[p]].view(shapes[p])
            for p in range(len(values))
        ]
        self.dest: Dict[int, torch.Tensor] = {
            p: self.rows[:, offsets[p] : offsets[p] + sizes[p]].view(replicas, *shapes[p])
            for p in into
        }
        self.one_mean = False  # `reduce` takes a mean as one torch.mean (`check`)

    def check(self, values: Sequence[torch.Tensor], op: str, want: Sequence) -> bool:
        """Whether this layout's reduction gives ``want`` (the group's per-value results)
        on ``values`` (every one, as `__init__` takes them), bit for bit; for a mean, first
        whether one ``torch.mean`` over the replica dim gives the sum-then-divide bits
        (ATen's CPU mean of float32 is that sum and division in one call)."""
        r = self.replicas
        torch.cat([values[p].reshape(r, -1) for p in self.columns], 1, out=self.rows)
        if op == "mean":
            two = summed(self.rows, "mean", torch.empty_like(self.total))
            self.one_mean = same_bits(torch.mean(self.rows, 0, out=self.total), two)
        if not self.one_mean:
            summed(self.rows, op, self.total)
        return same_outputs(self.results, want)

    def reduce(
        self, values: Sequence[torch.Tensor], op: str, blocks: Sequence[torch.Tensor] = ()
    ) -> List[torch.Tensor]:
        """The results, with the ``into`` columns already written."""
        r = self.replicas
        parts = [values[p].reshape(r, -1) for p in self.order]
        if parts or blocks:
            torch.cat([*parts, *blocks], 1, out=self.copied)
        if op == "mean" and self.one_mean:
            torch.mean(self.rows, 0, out=self.total)
        else:
            summed(self.rows, op, self.total)
        return self.results
