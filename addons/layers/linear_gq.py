"""`LinearGQ`: a linear layer whose weight is stored 4-bit group-quantised (FlexGen)."""

from __future__ import annotations

from functools import partial
from typing import Optional

import numpy as np
import torch

from popxl_core import ReplicaGrouping, Tensor, dtype, float32, uint16

from ..module import Module
from ..named_tensors import NamedTensors
from ..ops.group_quantize_decompress import (
    group_quantize_compress_numpy,
    group_quantize_decompress,
)
from .weights_dict import WeightsDict, host_value

__all__ = ["LinearGQ", "group_quantize_compress_numpy"]


class LinearGQ(Module):
    """``x @ decompress(w) (+ bias)``: the weight held as packed 4-bit levels
    (``weight_compressed``, uint16) with a scale and a bias per group of ``group_size`` along
    ``dim`` of the (in, out) weight. The variables start as zeros: load them with
    `torch_mapping`, which compresses a torch ``nn.Linear``'s weight."""

    def __init__(
        self,
        out_features: int,
        bias: bool = True,
        replica_grouping: Optional[ReplicaGrouping] = None,
        group_size: int = 0,
        dim: int = -1,
    ) -> None:
        super().__init__()
        if dim not in (0, 1, -1):
            raise ValueError(f"LinearGQ quantises along dim 0 or 1 (-1) of the weight; got {dim}.")
        self.out_features = out_features
        self.bias = bias
        self.replica_grouping = replica_grouping
        self.group_size = group_size
        self.dim = dim

    def _zeros(self, name: str, shape, dt) -> Tensor:
        return self.add_variable_input(
            name, partial(np.zeros, shape), dt, replica_grouping=self.replica_grouping
        )

    def build(self, x: Tensor) -> Tensor:
        inner, grouped = (x.shape[-1], self.out_features)[:: 1 if self.dim else -1]
        if self.group_size <= 0 or grouped % self.group_size or self.group_size % 4:
            raise ValueError(
                f"LinearGQ group_size {self.group_size} must be a positive multiple of 4 "
                f"dividing {grouped}."
            )
        groups = grouped // self.group_size
        packed = self._zeros("weight_compressed", (inner, groups, self.group_size // 4), uint16)
        scale = self._zeros("weight_decompression_scale", (inner, groups, 1), x.dtype)
        shift = self._zeros("weight_decompression_bias", (inner, groups, 1), x.dtype)
        y = x @ group_quantize_decompress(packed, scale, shift, self.dim)
        if self.bias:
            y = y + self._zeros("bias", (y.shape[-1],), x.dtype)
        return y

    @staticmethod
    def torch_mapping(
        variables: NamedTensors,
        nn_layer: torch.nn.Linear,
        dtype: dtype = float32,
        group_size: int = 64,
        dim: int = -1,
    ) -> WeightsDict:
        """Host data for ``variables``: ``nn_layer``'s weight (transposed to (in, out))
        compressed, and its bias."""
        weight = nn_layer.weight.detach().T.numpy()
        names = ("weight_compressed", "weight_decompression_scale", "weight_decompression_bias")
        packed = group_quantize_compress_numpy(weight, group_size, dim)
        mapping = WeightsDict({variables[n]: v for n, v in zip(names, packed)})
        if nn_layer.bias is not None and "bias" in variables:
            mapping[variables.bias] = host_value(variables.bias, nn_layer.bias.detach(), dtype)
        return mapping
