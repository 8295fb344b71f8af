"""`Linear`: y = x @ weight + bias, with weight of shape (in_features, out_features)."""

from __future__ import annotations

from functools import partial

import numpy as np
import torch

from popxl_core import Tensor, dtype, float32

from ..module import Module
from ..named_tensors import NamedTensors
from .weights_dict import WeightsDict, host_value

__all__ = ["Linear", "plus_bias"]


def plus_bias(module: Module, y: Tensor, dtype: dtype, replica_grouping) -> Tensor:
    """``y`` plus ``module``'s zero-initialised variable "bias" (one per output feature):
    the bias of `Linear` and `LinearFP8`."""
    b = module.add_variable_input(
        "bias",
        partial(np.zeros, y.shape[-1]),
        dtype,
        replica_grouping=replica_grouping,
    )
    return y + b


class Linear(Module):
    """A fully connected layer. Variables: ``weight`` (in, out), ``bias`` (out,) if ``bias``.

    ``weight`` starts as N(0, 0.02) draws (``np.random``), ``bias`` as zeros.
    """

    def __init__(self, out_features: int, bias: bool = True, replica_grouping=None) -> None:
        super().__init__()
        self.out_features = out_features
        self.bias = bias
        self.replica_grouping = replica_grouping

    def build(self, x: Tensor) -> Tensor:
        w = self.add_variable_input(
            "weight",
            partial(np.random.normal, 0, 0.02, (x.shape[-1], self.out_features)),
            x.dtype,
            replica_grouping=self.replica_grouping,
        )
        y = x @ w
        return plus_bias(self, y, x.dtype, self.replica_grouping) if self.bias else y

    @staticmethod
    def torch_mapping(
        variables: NamedTensors, nn_layer: torch.nn.Linear, dtype: dtype = float32
    ) -> WeightsDict:
        """Host data for ``variables`` from ``nn_layer`` (its (out, in) weight transposed)."""
        mapping = WeightsDict()
        mapping[variables.weight] = host_value(variables.weight, nn_layer.weight.detach().T, dtype)
        if nn_layer.bias is not None and "bias" in variables:
            mapping[variables.bias] = host_value(variables.bias, nn_layer.bias.detach(), dtype)
        return mapping
