"""ConvTranspose of float8 operands with a power-of-two output scale (PopXL's
``conv_transpose_pow2scaled``: a ConvTranspose with a third, log2 scale input).

As for ``conv_pow2scaled``, the float8 values are decoded exactly to float32, the products are
summed in float32, scaled by ``2**log2_scale`` and rounded to float16.
"""

from __future__ import annotations

import torch

from .. import dtypes
from ..tensor import Tensor
from . import _spatial as sp
from ._conv_common import _attrs, _public_params
from ._utils import rand, spec
from .conv_transpose import _convt_infer, _convt_kernel, _convt_pads
from .fp8 import (
    _OPTION,
    _check_fp8,
    _check_scale,
    _fp8_of,
    _scale_tensor,
    pow2scale_cast_to_fp8,
    pow2scaled_kernel,
)
from .registry import Cost, OpDef, Sample, create_op, register

__all__ = ["conv_transpose_pow2scaled"]


def _infer(ins, stride, pads, dilation, groups, output_padding):
    x, w, s = ins
    _check_fp8(x, "conv_transpose_pow2scaled input")
    _check_fp8(w, "conv_transpose_pow2scaled weight")
    _check_scale(s, "conv_transpose_pow2scaled")
    # the float shape rule of conv_transpose, on float16 stand-ins of the same shapes
    as16 = [spec(x.shape, dtypes.float16), spec(w.shape, dtypes.float16)]
    (out,) = _convt_infer(as16, stride, pads, dilation, groups, output_padding)
    return [out]


_kernel = pow2scaled_kernel(_convt_kernel)


def _cost(ins, outs, attrs) -> Cost:
    per_in = 1
    for d in ins[1].shape[1:]:
        per_in *= d
    return Cost(2 * ins[0].nelms * per_in, sum(s.nbytes for s in (*ins, *outs)))


def conv_transpose_pow2scaled(
    t: Tensor,
    weight: Tensor,
    log2_scale,
    stride=(1, 1),
    padding=(0, 0, 0, 0),
    dilation=(1, 1),
    groups: int = 1,
    pad_type: str = "not_set",
    output_padding=(),
    output_shape=(),
    available_memory_proportions=None,
    partials_types=None,
    enable_conv_dithering=None,
) -> Tensor:
    """``conv_transpose(t, weight) * 2**log2_scale`` of float8 operands, as float16
    (`ops.conv_transpose`'s arguments; ``log2_scale`` an int in [-32, 32) or an int32
    scalar tensor)."""
    r, stride, pads, dilation = _public_params(
        "conv_transpose_pow2scaled", t, weight, stride, padding, dilation, pad_type
    )
    out_pad = sp.spatial_tuple(output_padding, r, "conv_transpose_pow2scaled output_padding", 0)
    pads = _convt_pads(pad_type, t, weight, stride, pads, dilation, out_pad, output_shape)
    s = _scale_tensor(log2_scale, "conv_transpose_pow2scaled")
    attrs = {**_attrs(stride, pads, dilation, int(groups)), "output_padding": out_pad}
    return create_op(CONV_TRANSPOSE_FP8, [t, weight, s], attrs)[0]


def _samples():
    x = rand(2, 3, 4, 4, low=-2, high=2, seed=530).astype("float16")
    w = rand(3, 2, 3, 3, low=-2, high=2, seed=531).astype("float16")
    f = dtypes.float8_143

    def build(a, b, sc):
        a8, b8 = pow2scale_cast_to_fp8(a, 0, f), pow2scale_cast_to_fp8(b, 0, f)
        return conv_transpose_pow2scaled(a8, b8, sc, stride=(2, 2), padding=(1, 1, 1, 1))

    def ref(a, b, _sc):
        y = torch.nn.functional.conv_transpose2d(
            _fp8_of(a, f, 0), _fp8_of(b, f, 0), stride=2, padding=1
        )
        return (y * 2.0**3).half()

    scale = torch.tensor(3, dtype=torch.int32).numpy()
    return [Sample([x, w, scale], build, ref, grad=False, rtol=0, atol=0, name="f143")]


CONV_TRANSPOSE_FP8 = register(
    OpDef(
        "ConvTransposePow2Scaled",
        _infer,
        _kernel,
        cost=_cost,
        samples=_samples,
        fp16_in_fp32=False,
        session_options=_OPTION,
        popxl_type="ConvTranspose",
        out_name="conv_transpose_out",
    )
)
