"""A folded run's group of consecutive all-reduces (`fold_reduce.reduce_group`) in buffers
kept between runs.

The group sums every value's replicas side by side: ``(R, n)`` rows, one ``torch.sum`` over
the replica dim into ``(n,)``, each result a view of that total. Made fresh each run, the
53 result views of GPT's step (a ``split`` and a ``view`` each) cost more than the sum
itself (~140 us of a ~4.5 ms R=4 step, measured in the step: its objects are out of the
cache by then). Where the main graph runs once a run, every value the run computes is dead
when it returns (`variants.py`: runs return copies, variables are written in place), so the
rows and the total can be kept, and the result views made once: each run writes the rows
(one ``cat`` into them), sums into the total and returns the same views. The arithmetic is
`fold_reduce._flat`'s, call for call: the same bits.
"""

from __future__ import annotations

from typing import List, Sequence

import torch

from .fold_reduce import summed

__all__ = ["KeptGroup"]


class KeptGroup:
    """One group's rows, total and result views, made at its first reduction."""

    def __init__(self, values: Sequence[torch.Tensor], replicas: int) -> None:
        self.replicas = replicas
        sizes = [v.numel() // replicas for v in values]
        n = sum(sizes)
        like = values[0]
        self.rows = torch.empty((replicas, n), dtype=like.dtype)
        self.total = torch.empty((n,), dtype=like.dtype)
        shapes = [(v.shape[0] // replicas, *v.shape[1:]) for v in values]
        self.results = [t.view(s) for t, s in zip(self.total.split(sizes), shapes)]

    def reduce(self, values: Sequence[torch.Tensor], op: str) -> List[torch.Tensor]:
        r = self.replicas
        torch.cat([v.reshape(r, -1) for v in values], 1, out=self.rows)
        summed(self.rows, op, self.total)
        return self.results
