"""ConvTranspose (ONNX layout, weight (C_in, C_out/groups, *k)) and the public `conv_transpose`.

ConvTranspose is the adjoint of Conv, so its data gradient is a Conv and its weight gradient a
ConvWeightsGrad with the roles of x and dy swapped.
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
    _public_params,
)
from ._conv_partials import PARTIALS_OPTION, partials_attr, with_partials
from ._utils import rand, spec
from .conv_grads import CONV_WEIGHTS_GRAD
from .registry import OpDef, Sample, create_op, register

__all__ = ["conv_transpose"]


# ConvTranspose ------------------------------------------------------------------------------
def _convt_sizes(x_shape, w_shape, stride, pads, dilation, output_padding):
    r = len(stride)
    out = []
    for i in range(r):
        full = stride[i] * (x_shape[2 + i] - 1) + sp.effective_kernel(w_shape[2 + i], dilation[i])
        n = full + output_padding[i] - pads[i] - pads[r + i]
        if n < 1:
            raise ValueError(f"spatial dim {i}: the output size {n} is not positive")
        out.append(n)
    return tuple(out)


def _convt_infer(ins, stride, pads, dilation, groups, output_padding, partials_type=None):
    x, w = ins
    _check_float(x, w)
    sp.check_rank(x.shape, "conv_transpose")
    _check_channels(x.shape, w.shape, groups, True)
    out = _convt_sizes(x.shape, w.shape, stride, pads, dilation, output_padding)
    return [spec((x.shape[0], w.shape[1] * groups, *out), x.dtype)]


def _convt_kernel(x, w, stride, pads, dilation, groups, output_padding):
    r = len(stride)
    full = _aten.convolution(x, w, None, stride, [0] * r, dilation, True, [0] * r, groups)
    # The output_padding tail gets no contributions; then the pads crop both ends.
    crop = [-p for p in pads[:r]] + [op - p for op, p in zip(output_padding, pads[r:])]
    return sp.prepad(full, crop)


def _convt_grad(ctx):
    dy, a = ctx.grad_output(0), ctx.attrs
    r = len(a["stride"])
    pads = tuple(a["pads"][:r]) + tuple(p - op for p, op in zip(a["pads"][r:], a["output_padding"]))
    params = _attrs(a["stride"], pads, a["dilation"], a["groups"])
    if "partials_type" in a:  # its gradients accumulate as it does
        params["partials_type"] = a["partials_type"]
    from .conv import CONV  # conv.py re-exports this module, so Conv is looked up when needed

    dx = dw = None
    if ctx.requires_grad(0):
        dx = create_op(CONV, [dy, ctx.input(1)], params)[0]
    if ctx.requires_grad(1):
        w_shape = ctx.op.inputs[1].shape
        dw = create_op(CONV_WEIGHTS_GRAD, [ctx.input(0), dy], {"weight_shape": w_shape, **params})[
            0
        ]
    return [dx, dw]


def _ref_convt(stride, pads, output_padding, groups=1, dilation=None):
    def ref(x, w):
        r = len(stride)
        full = _aten.convolution(
            x, w, None, stride, [0] * r, dilation or [1] * r, True, [0] * r, groups
        )
        tail = [op - p for op, p in zip(output_padding, pads[r:])]
        return F.pad(full, sp.torch_pads([-p for p in pads[:r]] + tail))

    return ref


def _convt_samples():
    S = Sample
    return [
        S(
            [rand(2, 4, 3, 3, seed=61), rand(4, 3, 3, 3, seed=62)],
            lambda x, w: conv_transpose(x, w, (2, 2), (1, 1, 1, 1), output_padding=(1, 1)),
            lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1),
            rtol=1e-4,
            atol=1e-5,
        ),
        S(
            [rand(1, 4, 4, 5, seed=63), rand(4, 2, 2, 3, seed=64)],
            lambda x, w: conv_transpose(x, w, (2, 1), (0, 1, 1, 0), (1, 2), groups=2),
            _ref_convt((2, 1), (0, 1, 1, 0), (0, 0), 2, (1, 2)),
            rtol=1e-4,
            atol=1e-5,
            name="asym_groups",
        ),
        S(
            [rand(2, 3, 5, seed=65), rand(3, 2, 4, seed=66)],
            lambda x, w: conv_transpose(x, w, (3,), output_shape=(15,)),
            _ref_convt((3,), (1, 0), (0,)),
            rtol=1e-4,
            atol=1e-5,
            name="1d_output_shape",
        ),
    ]


CONV_TRANSPOSE = register(
    OpDef(
        "ConvTranspose",
        _convt_infer,
        with_partials(_convt_kernel),
        grad=_convt_grad,
        cost=_conv_cost("in"),
        samples=_convt_samples,
        out_name="conv_transpose_out",
        session_options=PARTIALS_OPTION,
    )
)


def _convt_pads(pad_type, t, weight, stride, pads, dilation, output_padding, output_shape):
    kind = str(pad_type).lower()
    if not output_shape and kind not in ("same_upper", "same_lower"):
        return sp.auto_pads(kind, t.shape[2:], weight.shape[2:], stride, dilation, pads)
    r = len(stride)
    target = (
        sp.spatial_tuple(output_shape, r, "conv_transpose output_shape", 0)
        if output_shape
        else tuple(n * s for n, s in zip(t.shape[2:], stride))
    )
    begins, ends = [], []
    for i in range(r):
        full = stride[i] * (t.shape[2 + i] - 1) + sp.effective_kernel(
            weight.shape[2 + i], dilation[i]
        )
        total = full + output_padding[i] - target[i]
        if total < 0:
            raise ValueError(
                f"conv_transpose: output_shape {target} is larger than the full "
                "output; use output_padding"
            )
        small, big = total // 2, total - total // 2
        begins.append(small if kind == "same_upper" else big)
        ends.append(big if kind == "same_upper" else small)
    return tuple(begins + ends)


def conv_transpose(
    t: Tensor,
    weight: Tensor,
    stride: tuple[int, ...] = (1, 1),
    padding: tuple[int, ...] = (0, 0, 0, 0),
    dilation: tuple[int, ...] = (1, 1),
    groups: int = 1,
    pad_type: PadType = "not_set",
    output_padding: tuple[int, ...] = (),
    output_shape: tuple[int, ...] = (),
    available_memory_proportions: Sequence[float] | None = None,
    partials_types: Sequence[str] | None = None,
    enable_conv_dithering: Sequence[int] | None = None,
) -> Tensor:
    """Transposed convolution; ``weight`` is (C_in, C_out/groups, *k) as in ONNX.

    ``output_shape`` (spatial sizes) computes the pads the ONNX way and overrides ``padding``.
    ``partials_types`` as in `conv` (`popxl_core.ops._conv_partials`).
    """
    r, stride, pads, dilation = _public_params(
        "conv_transpose", t, weight, stride, padding, dilation, pad_type
    )
    out_pad = sp.spatial_tuple(output_padding, r, "conv_transpose output_padding", 0)
    pads = _convt_pads(pad_type, t, weight, stride, pads, dilation, out_pad, output_shape)
    attrs = {**_attrs(stride, pads, dilation, int(groups)), "output_padding": out_pad}
    partials = partials_attr(partials_types)
    if partials is not None:
        attrs["partials_type"] = partials
    return create_op(CONV_TRANSPOSE, [t, weight], attrs)[0]
