"""Normalisation ops: GroupNormalization (also behind layer_norm, as in popxl) and
BatchNormalization (inference), each with a closed-form gradient op.

Like PopART, GroupNormalization has three outputs: the result, the per-(sample, group) mean
and inverse standard deviation (shape (N * num_groups,)); the gradient op reuses the last two.
The public functions return only the result.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ..tensor import Tensor
from ._dtype_rules import floating
from ._utils import rand, same_dtype, spec
from .registry import Cost, OpDef, Sample, create_op, register

__all__ = ["batch_norm_inference", "group_norm", "layer_norm"]


def _norm_cost(flops_per_elm: int):
    def cost(ins, outs, attrs) -> Cost:
        nbytes = sum(s.nbytes for s in ins) + sum(s.nbytes for s in outs)
        return Cost(flops_per_elm * ins[0].nelms if ins[0].shape else 0, nbytes)

    return cost


def _check_channel_params(x, params: Sequence, names: Sequence[str]) -> int:
    if len(x.shape) < 2:
        raise ValueError(f"the input must have shape (N, C, ...), got {tuple(x.shape)}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"normalisation needs a floating point input, got {x.dtype.name}")
    same_dtype(x, *params)
    c = x.shape[1]
    for p, name in zip(params, names):
        if tuple(p.shape) != (c,):
            raise ValueError(
                f"{name} must have shape ({c},) (the channels, dim 1 of the input "
                f"{tuple(x.shape)}), got {tuple(p.shape)}"
            )
    return c


def _bshape(x: torch.Tensor):
    return (1, x.shape[1]) + (1,) * (x.dim() - 2)


# GroupNormalization -------------------------------------------------------------------------
def _gn_infer(ins, num_groups, epsilon):
    x, w, b = ins
    c = _check_channel_params(x, [w, b], ["weight", "bias"])
    if num_groups < 1 or c % num_groups:
        raise ValueError(f"num_groups={num_groups} does not divide the {c} channels")
    stats = spec((x.shape[0] * num_groups,), x.dtype)
    return [x, stats, stats]


def _gn_kernel(x, w, b, num_groups, epsilon):
    xg = x.reshape(x.shape[0], num_groups, -1)
    var, mean = torch.var_mean(xg, dim=2, unbiased=False, keepdim=True)
    inv = torch.rsqrt(var + epsilon)
    xhat = ((xg - mean) * inv).reshape(x.shape)
    y = xhat * w.reshape(_bshape(x)) + b.reshape(_bshape(x))
    return y, mean.reshape(-1), inv.reshape(-1)


def _gn_grad_infer(ins, num_groups):
    dy, x, w = ins[:3]
    same_dtype(dy, x)
    return [x, w, w]


def _gn_grad_kernel(dy, x, w, mean, inv, num_groups):
    n = x.shape[0]
    inv = inv.reshape(n, num_groups, 1)
    xh = (x.reshape(n, num_groups, -1) - mean.reshape(n, num_groups, 1)) * inv
    axes = [0, *range(2, x.dim())]
    dbias = dy.sum(axes)
    dweight = (dy * xh.reshape(x.shape)).sum(axes)
    dxh = (dy * w.reshape(_bshape(x))).reshape(n, num_groups, -1)
    dx = inv * (dxh - dxh.mean(2, keepdim=True) - xh * (dxh * xh).mean(2, keepdim=True))
    return dx.reshape(x.shape), dweight, dbias


def _gn_grad(ctx):
    if ctx.grad_output(1) is not None or ctx.grad_output(2) is not None:
        raise NotImplementedError(
            "GroupNormalization: gradients through the mean and inverse "
            "standard deviation outputs are not supported"
        )
    ins = [ctx.grad_output(0), ctx.input(0), ctx.input(1), ctx.output(1), ctx.output(2)]
    return create_op(GROUP_NORM_GRAD, ins, {"num_groups": ctx.attrs["num_groups"]})


def _gn_samples():
    def case(shape, groups, k, eps=1e-5):
        c = shape[1]
        inputs = [rand(*shape, seed=k), rand(c, low=0.5, high=1.5, seed=k + 1), rand(c, seed=k + 2)]
        return Sample(
            inputs,
            lambda x, w, b: group_norm(x, w, b, groups, eps),
            lambda x, w, b: F.group_norm(x, groups, w, b, eps),
            rtol=1e-4,
            atol=1e-5,
            name=f"{len(shape)}d_g{groups}",
        )

    layer = Sample(
        [rand(5, 8, seed=80), rand(8, low=0.5, high=1.5, seed=81), rand(8, seed=82)],
        lambda x, w, b: layer_norm(x, w, b, 1e-3),
        lambda x, w, b: F.layer_norm(x, (8,), w, b, 1e-3),
        rtol=1e-4,
        atol=1e-5,
        name="layer_norm",
    )
    return [case((2, 6, 3, 4), 3, 70), case((4, 6), 2, 73), case((2, 4, 5), 1, 76, 1e-2), layer]


def _gn_grad_samples():
    def build(dy, x, w, b):
        _, mean, inv = create_op(GROUP_NORM, [x, w, b], {"num_groups": 2, "epsilon": 1e-5})
        return tuple(create_op(GROUP_NORM_GRAD, [dy, x, w, mean, inv], {"num_groups": 2}))

    def ref(dy, x, w, b):
        x, w, b = (t.detach().requires_grad_() for t in (x, w, b))
        with torch.enable_grad():
            y = F.group_norm(x, 2, w, b, 1e-5)
            return torch.autograd.grad(y, (x, w, b), dy)

    inputs = [
        rand(3, 4, 5, seed=84),
        rand(3, 4, 5, seed=85),
        rand(4, low=0.5, seed=86),
        rand(4, seed=87),
    ]
    return [Sample(inputs, build, ref, grad=False, rtol=1e-4, atol=1e-5)]


GROUP_NORM = register(
    OpDef(
        "GroupNormalization",
        floating(_gn_infer),
        _gn_kernel,
        grad=_gn_grad,
        cost=_norm_cost(8),
        samples=_gn_samples,
        out_name="group_norm_out",
    )
)
GROUP_NORM_GRAD = register(
    OpDef(
        "GroupNormalizationGrad",
        _gn_grad_infer,
        _gn_grad_kernel,
        cost=_norm_cost(12),
        samples=_gn_grad_samples,
        out_name="group_norm_grad_out",
    )
)


def group_norm(
    t: Tensor, weight: Tensor, bias: Tensor, num_groups: int, eps: float = 1e-5
) -> Tensor:
    """Normalise ``t`` (N, C, ...) over each group of C/num_groups channels, then scale and
    shift per channel by ``weight`` and ``bias`` (shape (C,))."""
    attrs = {"num_groups": int(num_groups), "epsilon": float(eps)}
    return create_op(GROUP_NORM, [t, weight, bias], attrs)[0]


def layer_norm(t: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    """Normalise each sample of ``t`` (N, C, ...) over all its other axes; weight and bias
    have shape (C,). This is popxl's definition: a GroupNormalization with one group, which
    for a 2-D ``t`` is the usual layer norm over the last axis."""
    shape, w_shape = tuple(t.shape), tuple(weight.shape)
    if len(shape) > 2 and w_shape == shape[-1:] and w_shape != shape[1:2]:
        raise ValueError(
            f"layer_norm: the weight {w_shape} matches the last axis of the input "
            f"{shape}, but popxl's layer_norm scales along axis 1. Reshape the "
            f"input to 2-D first: t.reshape((-1, {shape[-1]}))."
        )
    return group_norm(t, weight, bias, 1, eps)


# BatchNormalization (inference) -------------------------------------------------------------
def _bn_infer(ins, epsilon, momentum):
    _check_channel_params(ins[0], ins[1:], ["scale", "bias", "mean", "var"])
    return [ins[0]]


def _bn_kernel(x, scale, bias, mean, var, epsilon, momentum):
    return F.batch_norm(x, mean, var, scale, bias, training=False, eps=epsilon)


def _bn_grad_infer(ins, epsilon):
    same_dtype(*ins)
    return [ins[1]] + [ins[2]] * 4


def _bn_grad_kernel(dy, x, scale, mean, var, epsilon):
    # dx, dscale and dbias are torch's own inference-mode backward (what eager autograd runs for
    # F.batch_norm(training=False)): a closed form with other reduction and multiplication
    # orders drifts from eager by round-off that grows with N*H*W (6.9e-5 on dscale for an
    # 8x96x28x28 input), which training then carries into every later step.
    dx, dscale, dbias = torch.ops.aten.native_batch_norm_backward(
        dy, x, scale, mean, var, None, None, False, epsilon, [True, True, True]
    )
    # torch treats the statistics as constants; their gradients follow from the same sums:
    # dscale = sum(dy * (x - mean)) * inv, so d/dvar = -0.5 * dscale * scale * inv**2.
    inv = torch.rsqrt(var + epsilon)
    return dx, dscale, dbias, -dbias * scale * inv, -0.5 * dscale * scale * inv * inv


def _bn_grad(ctx):
    ins = [ctx.grad_output(0), *(ctx.input(i) for i in (0, 1, 3, 4))]
    dx, dscale, dbias, dmean, dvar = create_op(
        BATCH_NORM_GRAD, ins, {"epsilon": ctx.attrs["epsilon"]}
    )
    return [dx, dscale, dbias, dmean, dvar]


def _bn_reference(eps):
    def ref(x, scale, bias, mean, var):
        b = (1, -1) + (1,) * (x.dim() - 2)
        return (x - mean.reshape(b)) / torch.sqrt(var.reshape(b) + eps) * scale.reshape(
            b
        ) + bias.reshape(b)

    return ref


def _bn_samples():
    def inputs(shape, k):
        c = shape[1]
        return [
            rand(*shape, seed=k),
            rand(c, low=0.5, high=1.5, seed=k + 1),
            rand(c, seed=k + 2),
            rand(c, seed=k + 3),
            rand(c, low=0.5, high=2.0, seed=k + 4),
        ]

    return [
        Sample(
            inputs((2, 3, 4, 5), 90),
            lambda *a: batch_norm_inference(*a),
            _bn_reference(1e-5),
            rtol=1e-4,
            atol=1e-5,
        ),
        Sample(
            inputs((6, 4), 95),
            lambda *a: batch_norm_inference(*a, epsilon=1e-2),
            _bn_reference(1e-2),
            rtol=1e-4,
            atol=1e-5,
            name="2d",
        ),
    ]


def _bn_grad_samples():
    def build(dy, x, scale, bias, mean, var):
        return tuple(create_op(BATCH_NORM_GRAD, [dy, x, scale, mean, var], {"epsilon": 1e-3}))

    def ref(dy, *args):
        args = [a.detach().requires_grad_() for a in args]
        with torch.enable_grad():
            return torch.autograd.grad(_bn_reference(1e-3)(*args), args, dy)

    c = 3
    inputs = [
        rand(2, c, 4, seed=100),
        rand(2, c, 4, seed=101),
        rand(c, low=0.5, seed=102),
        rand(c, seed=103),
        rand(c, seed=104),
        rand(c, low=0.5, high=2.0, seed=105),
    ]
    # bias is not an input of the grad op, but dbias (= sum of dy) is one of its outputs
    return [Sample(inputs, build, ref, grad=False, rtol=1e-4, atol=1e-5)]


BATCH_NORM = register(
    OpDef(
        "BatchNormalization",
        floating(_bn_infer),
        _bn_kernel,
        grad=_bn_grad,
        cost=_norm_cost(4),
        samples=_bn_samples,
        out_name="batch_norm_out",
    )
)
BATCH_NORM_GRAD = register(
    OpDef(
        "BatchNormalizationGrad",
        _bn_grad_infer,
        _bn_grad_kernel,
        cost=_norm_cost(6),
        samples=_bn_grad_samples,
        out_name="batch_norm_grad_out",
    )
)


def batch_norm_inference(
    t: Tensor,
    scale: Tensor,
    bias: Tensor,
    mean: Tensor,
    var: Tensor,
    epsilon: float = 1e-5,
    momentum: float = 0.9,
) -> Tensor:
    """Batch normalisation with fixed statistics: (t - mean) / sqrt(var + eps) * scale + bias,
    per channel (dim 1). ``momentum`` only matters in training and is kept for the API."""
    attrs = {"epsilon": float(epsilon), "momentum": float(momentum)}
    return create_op(BATCH_NORM, [t, scale, bias, mean, var], attrs)[0]
