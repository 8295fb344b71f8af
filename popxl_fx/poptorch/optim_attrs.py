"""What PopTorch checks when a training executor takes an optimizer (its
``_optimizer_attributes``): a warning for subclassed optimizers (their Python ``step`` is not
what runs), a once-only warning for attributes added after the first use (PopTorch ignores
them), and float16 gradient accumulators switching the mean reduction to Running.
"""

from __future__ import annotations

import torch

from . import optim
from ._logging import logger
from .enums import MeanReductionStrategy

__all__ = ["AttributeTracker", "check_accum_strategy", "warn_if_subclassed"]

# the optimizers PopTorch runs natively (torch's own and poptorch.optim's)
_NATIVE = (
    torch.optim.SGD,
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.RMSprop,
    optim.SGD,
    optim.Adam,
    optim.AdamW,
    optim.RMSprop,
    optim.LAMB,
)
# what torch.optim.Optimizer keeps in __dict__ besides attributes a user sets
_OWN = ("defaults", "state", "param_groups", "variable_attrs")


def warn_if_subclassed(optimizer: torch.optim.Optimizer) -> None:
    if type(optimizer) not in _NATIVE:
        logger.warning(
            "Optimizer `%s` subclassed from classes in poptorch.optim or torch.optim are "
            "unlikely to behave as intended. Poptorch does not run Python optimizer code "
            "directly; but instead uses IPU native optimisers (here: popxl_fx's update of "
            "its base class).",
            type(optimizer).__name__,
        )


class AttributeTracker:
    """The attributes an executor's first optimizer had; later extra ones are reported once
    (at debug level with ``Options.relaxOptimizerAttributesChecks()``)."""

    def __init__(self, relaxed: bool) -> None:
        self.log = logger.debug if relaxed else logger.warning
        self.expected: dict[str, set | None] = {}
        self.printed: set[str] = set()

    def check(self, optimizer: torch.optim.Optimizer) -> None:
        kind = type(optimizer).__name__
        self._check("default group variable", kind, optimizer.defaults)
        self._check("optimizer attribute", kind, [k for k in vars(optimizer) if k not in _OWN])
        for i, group in enumerate(optimizer.param_groups):
            self._check(f"group {i} attribute", kind, [k for k in group if k != "params"])

    def _check(self, what: str, kind: str, names) -> None:
        expected = self.expected.setdefault(what, None)
        if expected is None:  # the first optimizer's are what is expected
            self.expected[what] = set(names)
            return
        extra = [n for n in names if n not in expected]
        message = f"Ignoring unexpected {what} in {kind} optimizer: {extra}"
        if extra and message not in self.printed:
            self.printed.add(message)
            self.log(message)


def check_accum_strategy(optimizer, options, compiled: bool) -> None:
    """float16 gradient accumulators need PopTorch's Running mean (set before compiling)."""
    if getattr(optimizer, "accum_type", torch.float32) != torch.float16:
        return
    if getattr(optimizer, "use_combined_accum", False):
        return
    running = MeanReductionStrategy.Running
    if not compiled:  # the executor's frozen copy takes the strategy PopTorch implies
        options._unfreeze()
        options.Training.setMeanAccumulationAndReplicationReductionStrategy(running)
        options._freeze()
    elif options.Training.meanAccumulationAndReplicationReductionStrategy != running:
        raise ValueError(
            "Invalid optimizer: the new optimizer would require changing options.Training."
            "meanAccumulationAndReplicationReductionStrategy to "
            "poptorch.MeanReductionStrategy.Running but the executable is already compiled."
        )
