"""One seeded random stream for every piece of a phased step (``Options(rng="ipu")``).

The plain step's forward splits each random op's seed off one seed variable, in program
order, and writes the last split back (`popxl_fx.Module.seed`). Each phased piece is lowered
by a `Module` of its own, so each would make a seed variable of its own, all starting from
the same value: every piece would redraw the first piece's masks, and none would draw the
plain step's. Here the pieces share one variable instead, bound by reference: each piece
continues the split chain where the previous piece left it, as the plain forward does.

With several slices (gradient_accumulation, batch_serialisation) the phased step runs each
piece on every slice before the next piece, while the unphased loop runs the whole forward per
slice. Slice ``j`` then starts ``j * draws`` splits down the chain (``draws``: the splits of
one forward), which is where the unphased loop's ``j``-th forward starts; the variable ends
where the last slice's forward left it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import popxl_core as popxl
from popxl_core import ops

from .variable_data import SEED_NAME

__all__ = ["SeedStream"]


class SeedStream:
    """The phased step's seed variable (None: no piece draws) and its slices' seeds."""

    def __init__(self, lowered: Sequence[Any]) -> None:
        facts = [lp.graphs.facts.to_dict().get(SEED_NAME) for lp in lowered]
        made = [f for f in facts if f is not None]
        self.var: popxl.Tensor | None = made[0].create_tensor(SEED_NAME) if made else None
        self.draws = sum(lp.graphs.fxm.draws for lp in lowered)
        self.seeds: list[popxl.Tensor] = []

    @classmethod
    def shared(cls, lowered: Sequence[Any]) -> SeedStream:
        """The stream of the lowered pieces (`phased._Lowered`), its variable put in the
        locals of every piece that draws."""
        stream = cls(lowered)
        for lp in lowered:
            if SEED_NAME in lp.graphs.facts.to_dict():
                lp.local[SEED_NAME] = stream.var
        return stream

    def start(self, count: int) -> None:
        """Each of ``count`` slices' starting seed: the variable, then ``draws`` splits on."""
        if self.var is None:
            return
        self.seeds = [self.var]
        for _ in range(count - 1):
            self.seeds.append(_advanced(self.seeds[-1], self.draws))

    def bound(self, j: int) -> dict[str, popxl.Tensor]:
        """The seed slice ``j``'s forward calls advance in place (empty without draws)."""
        return {SEED_NAME: self.seeds[j]} if self.seeds else {}

    def finish(self) -> None:
        """The variable ends where the last slice's forward left the stream."""
        if len(self.seeds) > 1:
            ops.var_updates.copy_var_update_(self.var, self.seeds[-1])


def _advanced(seed: popxl.Tensor, n: int) -> popxl.Tensor:
    """``seed`` ``n`` splits down the chain `Module.seed` walks (its second half each time)."""
    for _ in range(n):
        seed = ops.split_random_seed(seed, 2)[1]
    return seed
