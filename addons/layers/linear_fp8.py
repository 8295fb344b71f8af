"""`LinearFP8`: a linear layer computed in float8 (popxl.addons' ``layers.linear_fp8``).

Forward: the weight and the input are cast to ``float8_143`` with power-of-two scales chosen
per call (``scale_metric``), multiplied by a pow2-scaled float8 matmul (float16 result) and
the bias added. Backward (`build_grad`): the incoming gradient is cast to ``float8_152`` with
its own scale, less 3 (headroom against overflow in the products), and both gradients are
pow2-scaled float8 matmuls against the forward's float8 operands.
"""

from __future__ import annotations

from functools import partial
from typing import Optional

import numpy as np

from popxl_core import (
    ReplicaGrouping,
    Tensor,
    constant,
    dtype,
    float8_143,
    float8_152,
    float32,
    ops,
)

from ..module import Module
from ..ops.fp8_amax_scale import fp8_amax_scale
from ..ops.fp8_mse_scale import fp8_mse_scale
from .linear import Linear, plus_bias

__all__ = ["LinearFP8"]

_GRAD_HEADROOM = 3  # log2 scale taken off the gradient's, so its products do not overflow


def truncated_normal(shape, scale: float = 0.02, bound: float = 2.0) -> np.ndarray:
    """N(0, scale) draws (``np.random``) redrawn until within ``bound`` standard deviations:
    the initialiser popxl.addons takes from ``scipy.stats.truncnorm(-2, 2)``."""
    out = np.random.normal(0.0, 1.0, shape)
    outside = np.abs(out) > bound
    while outside.any():
        out[outside] = np.random.normal(0.0, 1.0, int(outside.sum()))
        outside = np.abs(out) > bound
    return out * scale


class LinearFP8(Module):
    """``x @ weight + bias`` with float8 operands. ``scale_metric``: how each log2 scale is
    chosen: ``"amax"`` (`fp8_amax_scale`), ``"mse"`` (`fp8_mse_scale`) or ``"manual_scale"``
    (``scale`` for the weight and the input alike)."""

    def __init__(
        self,
        out_features: int,
        bias: bool = True,
        scale_metric: str = "amax",
        scale: int = 0,
        replica_grouping: Optional[ReplicaGrouping] = None,
    ) -> None:
        super().__init__()
        if scale_metric not in ("amax", "mse", "manual_scale"):
            raise ValueError(
                f"The scale_metric option {scale_metric} is not available. Please provide one "
                "of the following options: amax, mse or manual_scale."
            )
        self.out_features = out_features
        self.bias = bias
        self.scale_metric = scale_metric
        self.scale = scale
        self.replica_grouping = replica_grouping
        self.forward_fp8_type = float8_143
        self.grad_fp8_type = float8_152

    def fp8_scale(self, t: Tensor, fmt: dtype) -> Tensor:
        """The int32 log2 scale for casting ``t`` to ``fmt``, by ``scale_metric``."""
        if self.scale_metric == "amax":
            return fp8_amax_scale(t, fmt)
        if self.scale_metric == "mse":
            return fp8_mse_scale(t, fmt)
        return constant(self.scale)

    def _to_fp8(self, t: Tensor, fmt: dtype, key: str):
        """``(t cast to fmt, its log2 scale)``; both kept for the backward (``aux``)."""
        scale = self.fp8_scale(t, fmt)
        t8 = ops.pow2scale_cast_to_fp8(t, data_type=fmt, log2_scale=scale)
        self.aux[f"{key}_log2scale"], self.aux[f"{key}_fp8"] = scale, t8
        return t8, scale

    def build(self, x: Tensor) -> Tensor:
        w = self.add_variable_input(
            "weight",
            partial(truncated_normal, (x.shape[-1], self.out_features)),
            x.dtype,
            replica_grouping=self.replica_grouping,
        )
        w8, w_scale = self._to_fp8(w, self.forward_fp8_type, "w")
        x8, x_scale = self._to_fp8(x, self.forward_fp8_type, "x")
        y = ops.matmul_pow2scaled(x8, w8, log2_scale=-w_scale - x_scale)  # float16
        if x.dtype == float32:
            y = ops.cast(y, float32)
        return plus_bias(self, y, x.dtype, self.replica_grouping) if self.bias else y

    # one gradient per output, as named positional parameters (addons reads the signature);
    # `Module.build_grad`'s ``*grads`` only describes that protocol
    def build_grad(self, dLdy: Tensor) -> Tensor:  # type: ignore[override]
        s = self.fp8_scale(dLdy, self.grad_fp8_type) - constant(_GRAD_HEADROOM)
        s = ops.clip(s, -31, 31)
        g8 = ops.pow2scale_cast_to_fp8(dLdy, data_type=self.grad_fp8_type, log2_scale=s)
        w8, w_s = self.aux["w_fp8"], self.aux["w_log2scale"]
        x8, x_s = self.aux["x_fp8"], self.aux["x_log2scale"]
        dLdx = ops.matmul_pow2scaled(g8, w8.T, log2_scale=-w_s - s)
        self.var_grad["weight"] = ops.matmul_pow2scaled(g8.T, x8, log2_scale=-x_s - s).T
        if self.bias:
            self.var_grad["bias"] = ops.sum(dLdy, 0)
        return dLdx

    # the same variables as `Linear` (weight (in, out), bias): the same host data
    torch_mapping = staticmethod(Linear.torch_mapping)
