"""PopART's ``groupNormStridedChannelGrouping`` session option (``opts._Popart.set``): group
norm puts channel ``c`` in group ``c % G`` (strided) instead of torch's ``c // (C / G)``
(contiguous). With it set, an executor traces each ``nn.GroupNorm`` as that grouping: the
channels reordered so that each strided group is contiguous, torch's group norm without its
affine, the order restored, then the per-channel scale and shift.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["StridedGroupNorm", "rules"]

OPTION = "groupNormStridedChannelGrouping"


def strided_group_norm(m: nn.GroupNorm, x: torch.Tensor) -> torch.Tensor:
    """``m`` on ``x`` with channel ``c`` in group ``c % m.num_groups``."""
    n, c, groups = x.shape[0], x.shape[1], m.num_groups
    rest = tuple(x.shape[2:])
    grouped = x.reshape(n, c // groups, groups, *rest).transpose(1, 2).reshape(n, c, *rest)
    y = F.group_norm(grouped, groups, None, None, m.eps)
    y = y.reshape(n, groups, c // groups, *rest).transpose(1, 2).reshape(n, c, *rest)
    if not m.affine:
        return y
    shape = (1, c) + (1,) * len(rest)
    return y * m.weight.reshape(shape) + m.bias.reshape(shape)


class StridedGroupNorm:
    """The `popxl_fx.capture_watch.Rule` tracing group norms with PopART's strided grouping."""

    def call_args(self, tracer, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return args, kwargs

    def trace_through(self, module: nn.Module, args: tuple, kwargs: dict) -> Callable | None:
        if not isinstance(module, nn.GroupNorm):
            return None
        return lambda forward, x: strided_group_norm(module, x)


def rules(popart_options: dict) -> tuple:
    """The capture rules PopART's session options ask for."""
    return (StridedGroupNorm(),) if popart_options.get(OPTION) else ()
