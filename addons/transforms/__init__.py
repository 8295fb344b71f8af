"""addons transforms: functions from graphs to graphs."""

from .autodiff import autodiff, autodiff_with_accumulation
from .recompute import recompute_graph

__all__ = ["autodiff", "autodiff_with_accumulation", "recompute_graph"]
