"""What Conv, its gradient ops and ConvTranspose share: the checks, output sizes, cost, attrs and
the torch reference conv.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from . import _spatial as sp
from ._dtype_rules import check_float
from ._utils import same_dtype
from .registry import Cost

__all__ = ["PadType"]

PadType = Literal["not_set", "same_upper", "same_lower", "valid"]
_aten = torch.ops.aten


def _conv_cost(side: str):
    """2 flops per multiply-add: each element of the conv-output side meets a weight slice."""

    def cost(ins, outs, attrs) -> Cost:
        acts = outs[0] if side == "out" else ins[0]
        wshape = attrs.get("weight_shape") or ins[1].shape
        nbytes = sum(s.nbytes for s in ins) + sum(s.nbytes for s in outs)
        return Cost(2 * acts.nelms * int(np.prod(wshape[1:])), nbytes)

    return cost


def _check_float(x, w) -> None:
    same_dtype(x, w)
    check_float(x, "the convolution input")


def _conv_out_sizes(x_shape, w_shape, stride, pads, dilation) -> tuple[int, ...]:
    r = len(stride)
    out = []
    for i in range(r):
        padded = x_shape[2 + i] + pads[i] + pads[r + i]
        ek = sp.effective_kernel(w_shape[2 + i], dilation[i])
        if padded < ek:
            raise ValueError(
                f"spatial dim {i}: the padded input size {padded} is smaller than "
                f"the dilated kernel size {ek}"
            )
        out.append((padded - ek) // stride[i] + 1)
    return tuple(out)


def _check_channels(x_shape, w_shape, groups: int, transposed: bool) -> None:
    if len(x_shape) != len(w_shape):
        raise ValueError(
            f"the input has rank {len(x_shape)} but the weight has rank "
            f"{len(w_shape)}; both must be (N or C, C, *spatial)"
        )
    if groups < 1 or w_shape[0] % groups:
        raise ValueError(f"groups={groups} must be >= 1 and divide weight dim 0 ({w_shape[0]})")
    cin = w_shape[0] if transposed else w_shape[1] * groups
    if x_shape[1] != cin:
        layout = "(C_in, C_out/groups, *k)" if transposed else "(C_out, C_in/groups, *k)"
        raise ValueError(
            f"channel mismatch: the input has {x_shape[1]} channels but the weight "
            f"{tuple(w_shape)} {layout} with groups={groups} expects {cin}"
        )


def _attrs(stride, pads, dilation, groups=1):
    return {
        "stride": tuple(stride),
        "pads": tuple(pads),
        "dilation": tuple(dilation),
        "groups": groups,
    }


def _ref_conv(stride, pads, dilation=None, groups=1):
    def ref(x, w):
        r = len(stride)
        return _aten.convolution(
            F.pad(x, sp.torch_pads(pads)),
            w,
            None,
            stride,
            [0] * r,
            dilation or [1] * r,
            False,
            [0] * r,
            groups,
        )

    return ref


def _public_params(op, t, weight, stride, padding, dilation, pad_type, kernel_axis=2):
    r = sp.check_rank(t.shape, op)
    if len(weight.shape) != r + 2:
        raise ValueError(
            f"{op}: the weight {tuple(weight.shape)} must have rank {r + 2} for "
            f"the input {tuple(t.shape)}"
        )
    stride = sp.spatial_tuple(stride, r, f"{op} stride", 1)
    dilation = sp.spatial_tuple(dilation, r, f"{op} dilation", 1)
    pads = sp.spatial_tuple(padding, 2 * r, f"{op} padding", 0)
    if any(p < 0 for p in pads) or any(s < 1 for s in stride) or any(d < 1 for d in dilation):
        raise ValueError(
            f"{op}: padding must be >= 0 and stride, dilation >= 1, got "
            f"padding={pads}, stride={stride}, dilation={dilation}"
        )
    return r, stride, pads, dilation
