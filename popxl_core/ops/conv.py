"""Convolutions (NC + 1 to 3 spatial dims, ONNX pads): Conv, ConvTranspose and the gradient
ops ConvDataGrad and ConvWeightsGrad.

A conv's gradients are its own ops, as in PopART. ConvTranspose is the adjoint of Conv, so its
data gradient is a Conv and its weight gradient a ConvWeightsGrad with the roles swapped.
Negative pads (crops) are allowed internally; the public functions accept only pads >= 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from .. import dtypes
from ..tensor import Tensor
from . import _spatial as sp
from ._dtype_rules import check_float
from ._utils import rand, same_dtype, spec
from .forms import JointGrad
from .registry import Cost, OpDef, Sample, create_op, register

__all__ = ["PadType", "conv", "conv_transpose"]

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


def _conv_infer(ins, stride, pads, dilation, groups):
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


def _conv_backward(dy, x, w, stride, pads, dilation, groups, mask):
    r = len(stride)
    pad = list(pads[:r]) if sp.is_symmetric(pads) else [0] * r
    bias_sizes = [w.shape[0]] if mask[2] else None
    return _aten.convolution_backward(
        dy, x, w, bias_sizes, stride, pad, dilation, False, [0] * r, groups, mask
    )


def _data_grad_kernel(dy, w, input_shape, stride, pads, dilation, groups):
    r = len(stride)
    shape = list(input_shape)
    if not sp.is_symmetric(pads):
        shape[2:] = [shape[2 + i] + pads[i] + pads[r + i] for i in range(r)]
    x = dy.new_empty(1).expand(shape)  # only the shape is read
    dx = _conv_backward(dy, x, w, stride, pads, dilation, groups, (True, False, False))[0]
    return dx if sp.is_symmetric(pads) else sp.prepad(dx, [-p for p in pads])


def _weights_grad_kernel(dy, x, weight_shape, stride, pads, dilation, groups):
    xp = x if sp.is_symmetric(pads) else sp.prepad(x, pads)
    w = dy.new_empty(1).expand(weight_shape)  # only the shape is read
    return _conv_backward(dy, xp, w, stride, pads, dilation, groups, (False, True, False))[1]


def _bias_grad_kernel(dy, x, w, stride, pads, dilation, groups):
    # torch's conv backend sums the bias gradient itself (in its own order), so ask it
    xp = x if sp.is_symmetric(pads) else sp.prepad(x, pads)
    return _conv_backward(dy, xp, w, stride, pads, dilation, groups, (False, False, True))[2]


def _bias_grad_infer(ins, **attrs):
    same_dtype(*ins)
    return [spec((ins[2].shape[0],), ins[0].dtype)]


def _grad_infer(key):
    def infer(ins, **attrs):
        same_dtype(ins[0], ins[1])
        return [spec(attrs[key], ins[0].dtype)]

    return infer


def _conv_params(a) -> dict:
    return {k: a[k] for k in ("stride", "pads", "dilation", "groups")}


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


def _grad_sample_cases():
    """(x, w, attrs) of convs whose gradient ops are tested against torch autograd."""
    return [
        (rand(2, 3, 6, 5, seed=41), rand(4, 3, 3, 2, seed=42), _attrs((1, 1), (1,) * 4, (1, 1))),
        (
            rand(1, 4, 9, 7, seed=43),
            rand(4, 2, 2, 3, seed=44),
            _attrs((2, 2), (1, 0, 0, 2), (1, 2), 2),
        ),
        (rand(2, 2, 8, seed=45), rand(3, 2, 3, seed=46), _attrs((3,), (2, -1), (1,))),
    ]


def _autograd_ref(which, a):
    def ref(dy, x, w):
        x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
        with torch.enable_grad():
            y = _ref_conv(a["stride"], a["pads"], a["dilation"], a["groups"])(x, w)
            return torch.autograd.grad(y, (x, w), dy)[which]

    return ref


def _conv_grad_samples(opdef_name):
    out = []
    for i, (x, w, a) in enumerate(_grad_sample_cases()):
        y_shape = _conv_out_sizes(x.shape, w.shape, a["stride"], a["pads"], a["dilation"])
        dy = rand(x.shape[0], w.shape[0], *y_shape, seed=50 + i)
        if opdef_name == "data":

            def build(dy, x, w, a=a):
                return create_op(CONV_DATA_GRAD, [dy, w], {"input_shape": x.shape, **a})[0]
        else:

            def build(dy, x, w, a=a):
                return create_op(CONV_WEIGHTS_GRAD, [dy, x], {"weight_shape": w.shape, **a})[0]

        out.append(
            Sample(
                [dy, x, w],
                build,
                _autograd_ref(0 if opdef_name == "data" else 1, a),
                grad=False,
                rtol=1e-4,
                atol=1e-5,
                name=f"case{i}",
            )
        )
    return out


def _bias_grad_samples():
    """The bias gradient against torch autograd's, bit for bit (the same backend kernel)."""
    a = _attrs((2, 1), (1, 1, 1, 1), (1, 1))

    def build(dy, x, w):
        return create_op(CONV_BIAS_GRAD, [dy, x, w], a)[0]

    def ref(dy, x, w):
        b = torch.zeros(w.shape[0], requires_grad=True)
        with torch.enable_grad():
            return torch.autograd.grad(F.conv2d(x, w, b, (2, 1), 1), b, dy)[0]

    dy = rand(2, 4, 4, 6, seed=56)
    return [
        Sample(
            [dy, rand(2, 3, 7, 6, seed=57), rand(4, 3, 3, 3, seed=58)],
            build,
            ref,
            grad=False,
            rtol=0.0,
            atol=0.0,
        )
    ]


# ConvDataGrad and ConvWeightsGrad of one Conv in one ``convolution_backward`` call
# (`OpDef.joint_grad`, sim/conv_pairs.py): eager PyTorch asks for both results at once, and
# each is the same computation as the single one (separate GEMMs), so the same bits
_JOINT_KEYS = ("stride", "pads", "dilation", "groups")


def _joint_eligible(op) -> bool:
    if not sp.is_symmetric(op.attrs["pads"]):
        return False  # the kernels pre-pad x / crop dx themselves
    return all(t.dtype is dtypes.float32 for t in (*op.inputs, *op.outputs))


def _joint_matches(data, weight) -> bool:
    if any(data.attrs[k] != weight.attrs[k] for k in _JOINT_KEYS):
        return False
    x, w = weight.inputs[1], data.inputs[1]
    shapes = tuple(data.attrs["input_shape"]), tuple(weight.attrs["weight_shape"])
    return shapes == (tuple(x.shape), tuple(w.shape))


def _joint_kernel(data):
    """``(dy, x, w) -> (dx, dw)`` in one ``convolution_backward`` call."""
    a = {k: data.attrs[k] for k in _JOINT_KEYS}

    def dx_dw(dy, x, w):
        dx, dw, _ = _conv_backward(dy, x, w, mask=(True, True, False), **a)
        return dx, dw

    return dx_dw


def _joint(role: str) -> JointGrad:
    return JointGrad(role, _joint_eligible, _joint_matches, _joint_kernel)


CONV = register(
    OpDef(
        "Conv",
        _conv_infer,
        _conv_kernel,
        grad=_conv_grad,
        cost=_conv_cost("out"),
        samples=_conv_samples,
        out_name="conv_out",
    )
)
CONV_DATA_GRAD = register(
    OpDef(
        "ConvDataGrad",
        _grad_infer("input_shape"),
        _data_grad_kernel,
        cost=_conv_cost("in"),
        samples=lambda: _conv_grad_samples("data"),
        out_name="conv_data_grad_out",
        joint_grad=_joint("data"),
        fresh_outputs=True,  # convolution_backward's (or a slice of it, for one-sided pads)
    )
)
CONV_BIAS_GRAD = register(
    OpDef(
        "ConvBiasGrad",
        _bias_grad_infer,
        _bias_grad_kernel,
        cost=lambda ins, outs, attrs: Cost(ins[0].nelms, ins[0].nbytes),
        samples=lambda: _bias_grad_samples(),
        out_name="conv_bias_grad_out",
    )
)
CONV_WEIGHTS_GRAD = register(
    OpDef(
        "ConvWeightsGrad",
        _grad_infer("weight_shape"),
        _weights_grad_kernel,
        cost=_conv_cost("in"),
        samples=lambda: _conv_grad_samples("weights"),
        out_name="conv_weights_grad_out",
        joint_grad=_joint("weight"),
    )
)


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
    have no effect on the numbers. ``bias`` (C_out,), an extension of popxl's signature (ONNX
    Conv's optional input B), is added inside the conv kernel, as torch's conv does.
    """
    _, stride, pads, dilation = _public_params(
        "conv", t, weight, stride, padding, dilation, pad_type
    )
    pads = sp.auto_pads(pad_type, t.shape[2:], weight.shape[2:], stride, dilation, pads)
    ins = [t, weight] + ([bias] if bias is not None else [])
    return create_op(CONV, ins, _attrs(stride, pads, dilation, int(groups)))[0]


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


def _convt_infer(ins, stride, pads, dilation, groups, output_padding):
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
        _convt_kernel,
        grad=_convt_grad,
        cost=_conv_cost("in"),
        samples=_convt_samples,
        out_name="conv_transpose_out",
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
    """
    r, stride, pads, dilation = _public_params(
        "conv_transpose", t, weight, stride, padding, dilation, pad_type
    )
    out_pad = sp.spatial_tuple(output_padding, r, "conv_transpose output_padding", 0)
    pads = _convt_pads(pad_type, t, weight, stride, pads, dilation, out_pad, output_shape)
    attrs = {**_attrs(stride, pads, dilation, int(groups)), "output_padding": out_pad}
    return create_op(CONV_TRANSPOSE, [t, weight], attrs)[0]
