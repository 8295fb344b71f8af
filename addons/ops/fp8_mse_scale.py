"""``fp8_mse_scale``: on the device, the float8 log2 scale with the least estimated squared
error (popxl.addons' ``Fp8FindBestScale`` custom op). Its algorithm is PopXL's
``popxl.fp8_utils.host_fp8_mse_scale`` (a histogram of binary exponents, an error model per
scaling bias, the middle of tied biases), which the op computes on the tensor's values; the
host and device scales are equal, as popxl.addons' test of the op checks."""

from __future__ import annotations

import numpy as np
import torch

import popxl_core as popxl
from popxl_core import Tensor, TensorSpec
from popxl_core.fp8_utils import host_fp8_mse_scale
from popxl_core.ops.registry import Cost, OpDef, Sample, create_op, register

__all__ = ["fp8_mse_scale", "FP8_MSE_SCALE"]

_FORMATS = {"float8_143": popxl.float8_143, "float8_152": popxl.float8_152}


def _infer(ins, fmt: str):
    if ins[0].dtype not in (popxl.float16, popxl.float32):
        raise TypeError(f"fp8_mse_scale: src must be float16 or float32, got {ins[0].dtype.name}.")
    return [TensorSpec((), popxl.int32)]


def _kernel(src, *, fmt: str):
    scale = host_fp8_mse_scale(src.detach().numpy().reshape(-1), _FORMATS[fmt])[1]
    return torch.tensor(scale, dtype=torch.int32)


def _samples():
    x = np.random.default_rng(0).uniform(-64, -32, 10).astype(np.float32)
    return [
        Sample(
            [x.astype(dt)],
            lambda t, f=f: fp8_mse_scale(t, _FORMATS[f]),
            lambda t, f=f: torch.tensor(host_fp8_mse_scale(t.numpy(), _FORMATS[f])[1]),
            grad=False,
            name=f"{f}_{np.dtype(dt).name}",
        )
        for f in _FORMATS
        for dt in (np.float16, np.float32)
    ]


FP8_MSE_SCALE = register(
    OpDef(
        "Fp8FindBestScale",
        _infer,
        kernel=_kernel,
        # a histogram pass over the source, then a fixed number of error sums
        cost=lambda ins, outs, attrs: Cost(2 * ins[0].nelms, ins[0].nbytes + 4),
        samples=_samples,
        out_name="scaling_bias",
    )
)


def fp8_mse_scale(src: Tensor, dtype=popxl.float8_143) -> Tensor:
    """The int32 log2 scale for casting ``src`` (float16 or float32) to ``dtype``
    (``popxl.float8_143`` or ``float8_152``) with the least estimated squared error, for
    ``ops.pow2scale_cast_to_fp8``."""
    if dtype not in _FORMATS.values():
        raise TypeError(f"fp8_mse_scale: dtype must be float8_143 or float8_152, got {dtype}.")
    return create_op(FP8_MSE_SCALE, [src], {"fmt": dtype.name})[0]
