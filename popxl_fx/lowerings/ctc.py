"""CTC loss (``F.ctc_loss``, ``nn.CTCLoss``) as one ``Aten`` op running
eager's ``F.ctc_loss``, forward and backward, so the loss and its gradient are eager's bit for
bit. Targets and lengths are whatever the call gives (tensors or lists of ints).

Torch's fake kernels cannot size CTC's intermediate ``log_alpha`` when the lengths are
tensors (it depends on their values), so the op declares its output shape itself (`CtcLoss`'s
``fake``): one loss per sample, or a scalar when reduced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from popxl_core.ops import aten_op

from ..lowering import LoweringContext, lowers
from .eager_layout import lower_call

__all__ = ["CtcLoss"]


@dataclass(frozen=True)
class CtcLoss:
    """``F.ctc_loss`` as an ``Aten`` operator whose output shape does not depend on data."""

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return F.ctc_loss(*args, **kwargs)

    def fake(
        self,
        log_probs: torch.Tensor,
        targets: Any,
        input_lengths: Any,
        target_lengths: Any,
        blank: int = 0,
        reduction: str = "mean",
        zero_infinity: bool = False,
    ) -> torch.Tensor:
        """A tensor of the loss's shape and dtype that depends on ``log_probs`` (so the shape
        rule sees a differentiable output): ``[N]`` (or ``[]`` unbatched) for 'none'."""
        first = log_probs.select(0, 0)
        per_sample = first.sum(-1)
        return per_sample if reduction == "none" else per_sample.sum()

    def __str__(self) -> str:
        return "ctc_loss"


@lowers(F.ctc_loss)
def _ctc_function(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Any:
    return lower_call(aten_op, ctx, args, kwargs, fn=CtcLoss())


@lowers(nn.CTCLoss)
def _ctc_module(ctx: LoweringContext, module: nn.CTCLoss, *args: Any) -> Any:
    # the module's options follow the call's tensors as keywords (`lower_call` reads the
    # dtypes torch saw from the node's own arguments, which come first)
    options = {"blank": module.blank, "reduction": module.reduction}
    options["zero_infinity"] = module.zero_infinity
    return lower_call(aten_op, ctx, args, options, fn=CtcLoss())
