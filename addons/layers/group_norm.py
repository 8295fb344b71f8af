"""`GroupNorm`: normalise each group of channels of (N, C, ...) input, then scale and shift."""

from __future__ import annotations

from functools import partial

import numpy as np
import torch

from popxl_core import Tensor, dtype, float32, ops

from ..module import Module
from ..named_tensors import NamedTensors
from .weights_dict import WeightsDict, host_value

__all__ = ["GroupNorm"]


class GroupNorm(Module):
    """Group normalisation (like ``torch.nn.GroupNorm(num_groups, C, eps)``).

    Variables: ``weight`` (ones) and ``bias`` (zeros), both of shape (C,) = (x.shape[1],).
    """

    def __init__(
        self, num_groups: int, replica_grouping=None, eps: float = 1e-5, cache: bool = False
    ) -> None:
        super().__init__(cache=cache)
        self.num_groups = num_groups
        self.replica_grouping = replica_grouping
        self.eps = eps

    def build(self, x: Tensor) -> Tensor:
        if x.rank < 2:
            raise ValueError(f"GroupNorm expects (N, C, ...) input, got shape {x.shape}.")
        channels = x.shape[1]
        w = self.add_variable_input(
            "weight", partial(np.ones, channels), x.dtype, replica_grouping=self.replica_grouping
        )
        b = self.add_variable_input(
            "bias", partial(np.zeros, channels), x.dtype, replica_grouping=self.replica_grouping
        )
        return ops.group_norm(x, w, b, self.num_groups, self.eps)

    @staticmethod
    def torch_mapping(
        variables: NamedTensors, nn_layer: torch.nn.GroupNorm, dtype: dtype = float32
    ) -> WeightsDict:
        """Host data for ``variables`` from ``nn_layer`` (elementwise affine)."""
        return WeightsDict(
            {
                variables.weight: host_value(variables.weight, nn_layer.weight.detach(), dtype),
                variables.bias: host_value(variables.bias, nn_layer.bias.detach(), dtype),
            }
        )
