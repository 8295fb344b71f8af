"""`RepeatStep`: a trainer step on inputs like the last step's, without its lookups.

A training loop calls the trainer with tensors of the same shapes and dtypes step after step,
on a model whose structure and modes stay as they are. A step on the full path binds the
inputs, builds the program cache's signature (input shapes and dtype names, every module's
mode, the keyword binding, the structure) and feeds `Session.run` a dict of streams, which
checks every array against its stream's spec again. After such a step the trainer keeps a
`RepeatStep`. A later step that passes no keyword arguments, with tensors of the same shapes
and dtypes (compared as torch's own objects) and the same modes (`program_key.same_key`, the
program cache's own answer), the same `Structure` object (`StructureWatch` returns the very
object while nothing it covers changed, storage pointers included), while that program is
still the active one, has the same signature: it is the same program. Its inputs
and the optimizer's hyper-parameters go to a `PreparedRun` of the program's Session as a
list. Anything else takes the full path, which makes a new `RepeatStep`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .program_key import same_key
from .replication import ReplicaFeeds

__all__ = ["RepeatStep", "hyper_feeds"]


def hyper_feeds(prog, options) -> dict:
    """The optimizer's hyper-parameters read now, laid out per replica and device iteration
    as the program's streams take them (every step, full path or repeated)."""
    n = options.device_iterations
    layout = prog.extra.replica_feeds
    if layout is None:
        layout = prog.extra.replica_feeds = ReplicaFeeds(options.replication_factor, n)
    return layout(prog.optim.feeds_for(n))


def _shapes(inputs: Sequence[Any]) -> tuple | None:
    """Each input's shape and dtype as torch objects (None: an input is not a tensor)."""
    if not all(isinstance(v, torch.Tensor) for v in inputs):
        return None
    return tuple((v.shape, v.dtype) for v in inputs)


class RepeatStep:
    """What a full-path step established, for the steps that repeat it."""

    def __init__(
        self, prog, inputs: Sequence[torch.Tensor], structure, modes: tuple, hyper: Mapping, options
    ) -> None:
        self.prog, self.structure = prog, structure
        self.key = (modes, _shapes(inputs))  # with the structure: what picked the program
        self._options = options
        self._hyper = tuple(hyper)
        self._run = prog.session.prepared_run([*prog.inputs.streams, *self._hyper])

    @classmethod
    def after(
        cls, prog, inputs: tuple, kwargs: dict, structure, modes, hyper: Mapping, options
    ) -> RepeatStep | None:
        """The `RepeatStep` of a full-path step, or None where steps cannot repeat it this
        way (keyword arguments, an input that is not a tensor, modes not known)."""
        if kwargs or modes is None or _shapes(inputs) is None:
            return None
        return cls(prog, inputs, structure, modes, hyper, options)

    def holds(self, inputs: tuple, structure, modes, active) -> bool:
        """This step's program is the one the full path would pick for these inputs."""
        # the very structure: nothing re-walked since (an equal one is the same program, but
        # its tensors' storage may have moved: the full path shares them anew)
        same = active is self.prog and structure is self.structure
        return same and same_key((modes, _shapes(inputs)), self.key)

    def run(self, inputs: Sequence[torch.Tensor]) -> Mapping:
        """One run of the program on ``inputs``, with the optimizer's hyper-parameters read
        now, both laid out as the full path lays them out (per replica, per device
        iteration); the outputs are in buffers the next run writes."""
        hyper = hyper_feeds(self.prog, self._options)
        arrays = list(self.prog.inputs.feed(inputs).values())  # in the streams' order
        arrays += [hyper[s] for s in self._hyper]
        return self._run(arrays)
