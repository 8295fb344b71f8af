"""Convolutions (NC + 1 to 3 spatial dims, ONNX pads): the Conv op and the public `conv`.

A conv's gradients are its own ops, as in PopART (conv_grads.py). ConvTranspose
(conv_transpose.py) is re-exported here, where popxl has it. Negative pads (crops) are allowed
internally; the public functions accept only pads >= 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.nn.functional as F

from ..tensor import Tensor
from . import _spatial as sp
from ._conv_common import (
    PadType,
    _aten,
    _attrs,
    _check_channels,
    _check_float,
    _conv_cost,
    _conv_out_sizes,
    _public_params,
    _ref_conv,
)
from ._conv_partials import PARTIALS_OPTION, partials_attr, with_partials
from ._utils import rand, same_dtype, spec
from .conv_grads import CONV_BIAS_GRAD, CONV_DATA_GRAD, CONV_WEIGHTS_GRAD
from .conv_transpose import conv_transpose
from .registry import OpDef, Sample, create_op, register

__all__ = ["PadType", "conv", "conv_transpose"]


def _conv_infer(ins, stride, pads, dilation, groups, partials_type=None):
    x, w, *bias = ins
    _check_float(x, w)
    if bias:
        same_dtype(x, bias[0])
        if tuple(bias[0].shape) != (w.shape[0],):
            raise ValueError(
                f"the bias must have shape ({w.shape[0]},) (the output channels), "
                f"got {tuple(bias[0].shape)}"
            )
    sp.check_rank(x.shape, "conv")
    _check_channels(x.shape, w.shape, groups, False)
    out = _conv_out_sizes(x.shape, w.shape, stride, pads, dilation)
    return [spec((x.shape[0], w.shape[0], *out), x.dtype)]


def _conv_kernel(x, w, *bias, stride, pads, dilation, groups):
    r = len(stride)
    b = bias[0] if bias else None  # torch adds the bias inside the conv kernel
    if sp.is_symmetric(pads):
        return _aten.convolution(x, w, b, stride, pads[:r], dilation, False, [0] * r, groups)
    return _aten.convolution(
        sp.prepad(x, pads), w, b, stride, [0] * r, dilation, False, [0] * r, groups
    )


def _conv_params(a) -> dict:
    # the gradient ops accumulate as their conv does (PopART gives them the conv's options)
    keys = ("stride", "pads", "dilation", "groups", "partials_type")
    return {k: a[k] for k in keys if k in a}


def _conv_grad(ctx):
    dy, a = ctx.grad_output(0), _conv_params(ctx.attrs)
    x_t, w_t = ctx.op.inputs[:2]
    dx = dw = db = None
    if ctx.requires_grad(0):
        dx = create_op(CONV_DATA_GRAD, [dy, ctx.input(1)], {"input_shape": x_t.shape, **a})[0]
    if ctx.requires_grad(1):
        dw = create_op(CONV_WEIGHTS_GRAD, [dy, ctx.input(0)], {"weight_shape": w_t.shape, **a})[0]
    if len(ctx.op.inputs) == 3 and ctx.requires_grad(2):
        db = create_op(CONV_BIAS_GRAD, [dy, ctx.input(0), ctx.input(1)], a)[0]
    return [dx, dw, db][: len(ctx.op.inputs)]


def _conv_samples():
    S = Sample
    return [
        S(
            [rand(2, 3, 7, 6, seed=21), rand(4, 3, 3, 3, seed=22)],
            lambda x, w: conv(x, w, padding=(1, 1, 1, 1)),
            _ref_conv((1, 1), (1, 1, 1, 1)),
            rtol=1e-4,
            atol=1e-5,
        ),
        S(
            [rand(2, 3, 9, 8, seed=23), rand(2, 3, 2, 3, seed=24)],
            lambda x, w: conv(x, w, (2, 1), (1, 0, 2, 1), (2, 2)),
            _ref_conv((2, 1), (1, 0, 2, 1), (2, 2)),
            rtol=1e-4,
            atol=1e-5,
            name="asym_dilated",
        ),
        S(
            [rand(1, 4, 5, 5, seed=25), rand(6, 2, 3, 3, seed=26)],
            lambda x, w: conv(x, w, groups=2),
            _ref_conv((1, 1), (0,) * 4, groups=2),
            rtol=1e-4,
            atol=1e-5,
            name="groups",
        ),
        S(
            [rand(2, 3, 9, seed=27), rand(5, 3, 2, seed=28)],
            lambda x, w: conv(x, w, (2,), (1, 0)),
            _ref_conv((2,), (1, 0)),
            rtol=1e-4,
            atol=1e-5,
            name="1d",
        ),
        S(
            [rand(1, 2, 5, 5, seed=29), rand(3, 2, 3, 3, seed=30)],
            lambda x, w: conv(x, w, (2, 2), pad_type="same_upper"),
            _ref_conv((2, 2), (1, 1, 1, 1)),
            rtol=1e-4,
            atol=1e-5,
            name="same_upper",
        ),
        S(
            [rand(1, 2, 4, 4, 4, seed=31), rand(2, 2, 2, 2, 2, seed=32)],
            lambda x, w: conv(x, w, (1, 1, 1), (0, 1, 0, 1, 0, 1)),
            _ref_conv((1, 1, 1), (0, 1, 0, 1, 0, 1)),
            rtol=1e-4,
            atol=1e-5,
            name="3d",
        ),
        # with a bias, forward and all three gradients are torch's conv bit for bit
        S(
            [rand(2, 3, 7, 6, seed=33), rand(4, 3, 3, 3, seed=34), rand(4, seed=35)],
            lambda x, w, b: conv(x, w, (2, 1), (1, 1, 1, 1), bias=b),
            lambda x, w, b: F.conv2d(x, w, b, (2, 1), 1),
            rtol=0.0,
            atol=0.0,
            name="bias",
        ),
        S(
            [rand(1, 4, 6, 5, seed=36), rand(4, 2, 3, 2, seed=37), rand(4, seed=38)],
            lambda x, w, b: conv(x, w, padding=(1, 0, 0, 1), groups=2, bias=b),
            lambda x, w, b: _ref_conv((1, 1), (1, 0, 0, 1), groups=2)(x, w) + b.reshape(4, 1, 1),
            rtol=1e-5,
            atol=1e-6,
            name="bias_asym_groups",
        ),
    ]


CONV = register(
    OpDef(
        "Conv",
        _conv_infer,
        with_partials(_conv_kernel),
        grad=_conv_grad,
        cost=_conv_cost("out"),
        samples=_conv_samples,
        out_name="conv_out",
        session_options=PARTIALS_OPTION,
    )
)


def conv(
    t: Tensor,
    weight: Tensor,
    stride: tuple[int, ...] = (1, 1),
    padding: tuple[int, ...] = (0, 0, 0, 0),
    dilation: tuple[int, ...] = (1, 1),
    groups: int = 1,
    pad_type: PadType = "not_set",
    available_memory_proportions: Sequence[float] | None = None,
    partials_types: Sequence[str] | None = None,
    enable_conv_dithering: Sequence[int] | None = None,
    *,
    bias: Tensor | None = None,
) -> Tensor:
    """N-d convolution of ``t`` (N, C_in, *spatial) with ``weight`` (C_out, C_in/groups, *k).

    ``padding`` is ONNX-ordered (all begins, then all ends); ``pad_type`` 'same_upper',
    'same_lower' or 'valid' computes it instead. The IPU tuning options are accepted and
    have no effect on the numbers, except ``partials_types``: ``["float"]`` (or ``["half"]``)
    computes float16 inputs in float32 and rounds once (None: the session's
    ``convolutionOptions`` ``partialsType``; `popxl_core.ops._conv_partials`). ``bias``
    (C_out,), an extension of popxl's signature (ONNX Conv's optional input B), is added
    inside the conv kernel, as torch's conv does.
    """
    _, stride, pads, dilation = _public_params(
        "conv", t, weight, stride, padding, dilation, pad_type
    )
    pads = sp.auto_pads(pad_type, t.shape[2:], weight.shape[2:], stride, dilation, pads)
    ins = [t, weight] + ([bias] if bias is not None else [])
    attrs = _attrs(stride, pads, dilation, int(groups))
    partials = partials_attr(partials_types)
    if partials is not None:  # only where given: a conv without it prints as before
        attrs["partials_type"] = partials
    return create_op(CONV, ins, attrs)[0]
