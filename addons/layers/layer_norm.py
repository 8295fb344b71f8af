"""`LayerNorm`: normalise over the last axis, then scale by ``weight`` and shift by ``bias``."""

from __future__ import annotations

from functools import partial

import numpy as np
import torch

from popxl_core import Tensor, dtype, float32, ops

from ..module import Module
from ..named_tensors import NamedTensors
from .weights_dict import WeightsDict, host_value

__all__ = ["LayerNorm"]


class LayerNorm(Module):
    """Layer normalisation over the last axis (like ``torch.nn.LayerNorm(x.shape[-1])``).

    Variables: ``weight`` (ones) and ``bias`` (zeros), both of shape (x.shape[-1],).
    """

    def build(self, x: Tensor, eps: float = 1e-5) -> Tensor:
        hidden = x.shape[-1]
        w = self.add_variable_input("weight", partial(np.ones, hidden), x.dtype)
        b = self.add_variable_input("bias", partial(np.zeros, hidden), x.dtype)
        if x.rank == 2:
            return ops.layer_norm(x, w, b, eps=eps)
        # popxl's layer_norm scales along axis 1, so fold all leading axes into the batch.
        y = ops.layer_norm(x.reshape((-1, hidden)), w, b, eps=eps)
        return y.reshape(x.shape)

    @staticmethod
    def torch_mapping(
        variables: NamedTensors, nn_layer: torch.nn.LayerNorm, dtype: dtype = float32
    ) -> WeightsDict:
        """Host data for ``variables`` from ``nn_layer`` (elementwise affine); a torch layer
        normalising over several trailing dims has its weights flattened to match."""
        return WeightsDict(
            {
                v: host_value(v, p.detach().reshape(v.shape), dtype)
                for v, p in ((variables.weight, nn_layer.weight), (variables.bias, nn_layer.bias))
            }
        )
