"""A Conv's gradient ops, as in PopART: ConvDataGrad, ConvWeightsGrad and ConvBiasGrad, and the
joint kernel computing them in one call (`speed.JOINT_GRAD`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import dtypes
from ..sim.speed import declare
from . import _spatial as sp
from ._conv_common import (
    _aten,
    _attrs,
    _conv_cost,
    _conv_out_sizes,
    _ref_conv,
)
from ._conv_partials import PARTIALS_OPTION, stated, with_partials
from ._utils import rand, same_dtype, spec
from .forms import JointGrad
from .registry import Cost, OpDef, Sample, create_op, register

__all__: list[
    str
] = []  # declares the gradient ops; conv.py and conv_transpose.py import their OpDefs


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


# A Conv's gradient ops in one ``convolution_backward`` call (`speed.JOINT_GRAD`,
# sim/conv_pairs.py): eager PyTorch asks for them at once, and each result is the same
# computation as the single one (separate GEMMs for dx and dw; db in the weight pass either
# way), so the same bits
_JOINT_KEYS = ("stride", "pads", "dilation", "groups")


def _joint_eligible(op) -> bool:
    if not sp.is_symmetric(op.attrs["pads"]):
        return False  # the kernels pre-pad x / crop dx themselves
    types = {t.dtype for t in (*op.inputs, *op.outputs)}
    if types == {dtypes.float16}:  # the kernels compute it in float32 (`with_partials`)
        attrs = op.kernel_attrs()
        return stated(attrs.get("partials_type"), attrs.get("session_partials", ""))
    return types == {dtypes.float32}


def _joint_matches(other, weight) -> bool:
    """``other`` (a data- or bias-gradient op) and ``weight`` are one Conv's gradients."""
    if any(other.attrs[k] != weight.attrs[k] for k in _JOINT_KEYS):
        return False
    if other.inputs[0].dtype != weight.inputs[0].dtype:
        return False
    x_shape, w_shape = tuple(weight.inputs[1].shape), tuple(weight.attrs["weight_shape"])
    if "input_shape" in other.attrs:  # ConvDataGrad(dy, w)
        return (tuple(other.attrs["input_shape"]), tuple(other.inputs[1].shape)) == (
            x_shape,
            w_shape,
        )
    return other.inputs[1] is weight.inputs[1] and tuple(other.inputs[2].shape) == w_shape


def _joint_kernel(weight, mask: tuple):
    """``(dy, x, w) -> (dx, dw, db)`` in one ``convolution_backward`` call, None where
    ``mask`` is False; float16 operands computed in float32 and each result rounded once,
    as the single kernels do (`with_partials`)."""
    a = {k: weight.attrs[k] for k in _JOINT_KEYS}
    half = weight.inputs[0].dtype == dtypes.float16

    def joint(dy, x, w):
        if half:
            dy, x, w = dy.float(), x.float(), w.float()
        out = _conv_backward(dy, x, w, mask=mask, **a)
        return tuple(t.half() if half and t is not None else t for t in out)

    return joint


def _joint(role: str) -> JointGrad:
    return JointGrad(role, _joint_eligible, _joint_matches, _joint_kernel)


CONV_DATA_GRAD = register(
    OpDef(
        "ConvDataGrad",
        _grad_infer("input_shape"),
        with_partials(_data_grad_kernel),
        cost=_conv_cost("in"),
        samples=lambda: _conv_grad_samples("data"),
        out_name="conv_data_grad_out",
        session_options=PARTIALS_OPTION,
        fresh_outputs=True,  # convolution_backward's (or a slice of it, for one-sided pads)
    )
)
declare(CONV_DATA_GRAD, joint_grad=_joint("data"))
CONV_BIAS_GRAD = register(
    OpDef(
        "ConvBiasGrad",
        _bias_grad_infer,
        with_partials(_bias_grad_kernel),
        cost=lambda ins, outs, attrs: Cost(ins[0].nelms, ins[0].nbytes),
        samples=lambda: _bias_grad_samples(),
        out_name="conv_bias_grad_out",
        session_options=PARTIALS_OPTION,
    )
)
CONV_WEIGHTS_GRAD = register(
    OpDef(
        "ConvWeightsGrad",
        _grad_infer("weight_shape"),
        with_partials(_weights_grad_kernel),
        cost=_conv_cost("in"),
        samples=lambda: _conv_grad_samples("weights"),
        out_name="conv_weights_grad_out",
        session_options=PARTIALS_OPTION,
    )
)
declare(CONV_WEIGHTS_GRAD, joint_grad=_joint("weight"))
declare(CONV_BIAS_GRAD, joint_grad=_joint("bias"))
