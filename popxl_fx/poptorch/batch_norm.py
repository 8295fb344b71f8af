"""PopTorch's batch norm in an inference model: it keeps its running statistics.

An ``inferenceModel`` runs as a PopART inference session, which has no updates of variables:
a batch norm in training mode normalises with the batch's statistics, as eager torch does,
but its ``running_mean``, ``running_var`` and ``num_batches_tracked`` stay as they were (the
next call, and a ``copyWeightsToHost``, see them unchanged). An inference executor traces
such a module as torch's batch norm without running statistics.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import nn

__all__ = ["InferenceBatchNorm", "rules"]


class InferenceBatchNorm:
    """The `popxl_fx.capture_watch.Rule` tracing training-mode batch norms without updates."""

    def call_args(self, tracer, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return args, kwargs

    def trace_through(self, module: nn.Module, args: tuple, kwargs: dict) -> Callable | None:
        if not isinstance(module, nn.modules.batchnorm._BatchNorm) or not module.training:
            return None
        return lambda forward, x: F.batch_norm(
            x, None, None, module.weight, module.bias, True, 0.0, module.eps
        )


def rules(training: bool) -> tuple:
    """The capture rules of an executor's batch norms (none for a training model)."""
    return () if training else (InferenceBatchNorm(),)
