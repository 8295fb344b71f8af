"""`Conv2D`: a 2-D convolution of (N, C, H, W) input with an optional per-channel bias."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import numpy as np
import torch

from popxl_core import Tensor, dtype, float32, ops
from popxl_core.ops.conv import PadType

from ..module import Module
from ..named_tensors import NamedTensors
from .weights_dict import WeightsDict, host_value

__all__ = ["Conv2D"]


def _pair(v: int | Sequence[int], what: str) -> tuple[int, int]:
    t = (v, v) if isinstance(v, int) else tuple(v)
    if len(t) != 2:
        raise ValueError(f"Conv2D {what} must be an int or a pair, got {v!r}.")
    return t


class Conv2D(Module):
    """Like ``torch.nn.Conv2d``; ``paddings`` are ONNX-style (top, left, bottom, right), or a
    pad type such as ``"same_upper"``.

    Variables: ``weight`` (out, in/groups, kh, kw) from N(0, 0.02) draws, and ``bias``
    (out,) zeros when ``bias`` is True.
    """

    def __init__(
        self,
        out_channels: int,
        kernel_size: int | Sequence[int],
        strides: Sequence[int] = (1, 1),
        paddings: Sequence[int] | PadType = (0, 0, 0, 0),
        dilations: Sequence[int] = (1, 1),
        groups: int = 1,
        bias: bool = True,
        pad_type: PadType = "not_set",
        replica_grouping=None,
    ) -> None:
        super().__init__()
        self.out_channels = out_channels
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.strides = _pair(strides, "strides")
        if isinstance(paddings, str):  # popxl.addons: a pad type given as the paddings
            pad_type, paddings = paddings, (0, 0, 0, 0)
        self.paddings = tuple(paddings)
        self.dilations = _pair(dilations, "dilations")
        self.groups = groups
        self.bias = bias
        self.pad_type = pad_type
        self.replica_grouping = replica_grouping

    def build(self, x: Tensor) -> Tensor:
        if x.rank != 4:
            raise ValueError(f"Conv2D expects (N, C, H, W) input, got shape {x.shape}.")
        if x.shape[1] % self.groups:
            raise ValueError(
                f"Conv2D: groups={self.groups} does not divide the {x.shape[1]} input channels."
            )
        shape = (self.out_channels, x.shape[1] // self.groups, *self.kernel_size)
        w = self.add_variable_input(
            "weight",
            partial(np.random.normal, 0, 0.02, shape),
            x.dtype,
            replica_grouping=self.replica_grouping,
        )
        y = ops.conv(x, w, self.strides, self.paddings, self.dilations, self.groups, self.pad_type)
        if self.bias:
            b = self.add_variable_input(
                "bias",
                partial(np.zeros, self.out_channels),
                x.dtype,
                replica_grouping=self.replica_grouping,
            )
            y = y + b.reshape((self.out_channels, 1, 1))
        return y

    @staticmethod
    def torch_mapping(
        variables: NamedTensors, nn_layer: torch.nn.Conv2d, dtype: dtype = float32
    ) -> WeightsDict:
        """Host data for ``variables`` from ``nn_layer`` (same weight layout)."""
        mapping = WeightsDict()
        mapping[variables.weight] = host_value(variables.weight, nn_layer.weight.detach(), dtype)
        if nn_layer.bias is not None and "bias" in variables:
            mapping[variables.bias] = host_value(variables.bias, nn_layer.bias.detach(), dtype)
        return mapping
