"""Batch normalisation in training mode: BatchNormalizationTraining and its gradient op.

As in PopART's training-mode BatchNormalization (and poplibs' popnn), the forward op
normalises with the batch statistics and also outputs the per-channel mean and inverse
standard deviation it used, which the gradient op reads back; with running statistics it
outputs their updated values too. The kernels are torch's own (``native_batch_norm`` and
``native_batch_norm_backward``), so the numbers are eager PyTorch's bit for bit, running
statistics (exponential average with the unbiased batch variance) included.

Inputs: ``x`` (N, C, ...), then ``scale`` and ``bias`` (C,) when ``affine``, then
``running_mean`` and ``running_var`` (C,) when ``track``, then, for ``momentum=None`` (torch's
cumulative average), the updated batch count (an integer scalar): the factor is 1 / count.
Outputs: y, mean, inverse std[, new running mean, new running var].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..tensor import Tensor
from ._utils import rand, same_dtype, spec
from .registry import Cost, OpDef, Sample, create_op, register

__all__ = ["batch_norm_training"]

_aten = torch.ops.aten


def _cost(flops_per_elm: int):
    def cost(ins, outs, attrs) -> Cost:
        nbytes = sum(s.nbytes for s in ins) + sum(s.nbytes for s in outs)
        return Cost(flops_per_elm * ins[0].nelms, nbytes)

    return cost


def _n_params(affine: bool, track: bool) -> int:
    return 2 * affine + 2 * track


def _check_inputs(ins, affine: bool, track: bool, momentum) -> None:
    x = ins[0]
    want = 1 + _n_params(affine, track) + (track and momentum is None)
    if len(ins) != want:
        raise ValueError(
            f"expected {want} inputs (affine={affine}, track={track}, "
            f"momentum={momentum}), got {len(ins)}"
        )
    if len(x.shape) < 2 or not x.dtype.is_floating_point:
        raise ValueError(
            f"the input must be floating point with shape (N, C, ...), got "
            f"{tuple(x.shape)} {x.dtype.name}"
        )
    params = ins[1 : 1 + _n_params(affine, track)]
    _params_fit(x, params)
    for p in params:
        if tuple(p.shape) != (x.shape[1],):
            raise ValueError(
                f"scale, bias and running statistics must have shape "
                f"({x.shape[1]},) (the channels of {tuple(x.shape)}), got "
                f"{tuple(p.shape)}"
            )
    if x.nelms // x.shape[1] <= 1:
        raise ValueError(
            f"training-mode batch norm needs more than 1 value per channel, got "
            f"input {tuple(x.shape)}"
        )


def _params_fit(x, params) -> None:
    """torch's rule: parameters of x's dtype, or float32 parameters for a float16 / bfloat16
    x (its mixed type: statistics in float32, the output in x's dtype)."""
    same_dtype(*params)
    if params and params[0].dtype != x.dtype and not _mixed(x.dtype, params[0].dtype):
        raise TypeError(
            f"the scale, bias and statistics must be {x.dtype.name} (or float32 for a "
            f"float16/bfloat16 input), got {params[0].dtype.name}"
        )


def _mixed(x_dtype, param_dtype) -> bool:
    return x_dtype.name in ("float16", "bfloat16") and param_dtype.name == "float32"


def _infer(ins, epsilon, momentum, affine, track):
    _check_inputs(ins, affine, track, momentum)
    params = ins[1 : 1 + _n_params(affine, track)]
    stats = spec((ins[0].shape[1],), (params[0] if params else ins[0]).dtype)
    return [ins[0], stats, stats] + ([stats, stats] if track else [])


def _kernel(x, *rest, epsilon, momentum, affine, track):
    w, b = rest[:2] if affine else (None, None)
    if not track:
        return _aten.native_batch_norm(x, w, b, None, None, True, 0.0, epsilon)
    mean, var = (t.clone() for t in rest[2 * affine : 2 * affine + 2])
    # torch's BatchNorm passes 1 / num_batches_tracked as a Python float for momentum=None
    factor = 1.0 / float(rest[-1]) if momentum is None else momentum
    y, save_mean, save_invstd = _aten.native_batch_norm(x, w, b, mean, var, True, factor, epsilon)
    return y, save_mean, save_invstd, mean, var


def _grad_infer(ins, epsilon, affine):
    same_dtype(ins[0], ins[1])  # dy and x; the scale and statistics as in the forward
    _params_fit(ins[1], ins[2:])
    return [ins[1]] + ([ins[2], ins[2]] if affine else [])


def _grad_kernel(dy, x, *rest, epsilon, affine):
    w = rest[0] if affine else None
    mean, invstd = rest[-2:]
    mask = [True, affine, affine]
    grads = _aten.native_batch_norm_backward(
        dy, x, w, None, None, mean, invstd, True, epsilon, mask
    )
    return grads if affine else grads[0]


def _grad(ctx):
    if any(ctx.grad_output(i) is not None for i in range(1, len(ctx.op.outputs))):
        raise NotImplementedError(
            "BatchNormalizationTraining: gradients through the batch "
            "statistics outputs are not supported"
        )
    a = ctx.attrs
    n_in = len(ctx.op.inputs)
    ins = [ctx.grad_output(0), ctx.input(0)] + ([ctx.input(1)] if a["affine"] else [])
    ins += [ctx.output(1), ctx.output(2)]
    outs = create_op(
        BATCH_NORM_TRAINING_GRAD, ins, {"epsilon": a["epsilon"], "affine": a["affine"]}
    )
    return list(outs) + [None] * (n_in - len(outs))


def _reference(eps, momentum, affine, track, outputs="y"):
    def ref(x, *rest):
        w, b = rest[:2] if affine else (None, None)
        mean, var = (t.detach().clone() for t in rest[2 * affine :]) if track else (None, None)
        y = F.batch_norm(x, mean, var, w, b, True, momentum, eps)
        return y if outputs == "y" else (mean, var)

    return ref


def _inputs(shape, k, affine, track):
    c = shape[1]
    ins = [rand(*shape, seed=k)]
    if affine:
        ins += [rand(c, low=0.5, high=1.5, seed=k + 1), rand(c, seed=k + 2)]
    if track:
        ins += [rand(c, seed=k + 3), rand(c, low=0.5, high=2.0, seed=k + 4)]
    return ins


def _samples():
    def case(shape, k, affine=True, track=True, eps=1e-5, momentum=0.1, out="y", name="", x16=0):
        def build(*ts):
            y, mean, var = batch_norm_training(
                *_unpack(ts, affine, track), epsilon=eps, momentum=momentum
            )
            return y if out == "y" else (mean, var)

        ins = _inputs(shape, k, affine, track)
        ins[0] = ins[0].astype("float16") if x16 else ins[0]
        return Sample(
            ins,
            build,
            _reference(eps, momentum, affine, track, out),
            grad=out == "y",
            rtol=0.0,
            atol=0.0,
            name=name,
        )

    return [
        case((4, 3, 5, 6), 110, name="4d"),
        case((4, 3, 5, 6), 110, out="running", name="running_stats"),
        case((6, 4), 116, affine=False, eps=1e-3, momentum=0.3, name="2d_no_affine"),
        case((2, 3, 7), 120, track=False, name="3d_no_running"),
        case((2, 2, 3, 2, 2), 124, affine=False, track=False, name="5d_plain"),
        case((4, 3, 5), 128, name="half_input_float_params", x16=1),
        case((4, 3, 5), 128, out="running", name="half_input_running_stats", x16=1),
    ]


def _unpack(ts, affine, track):
    it = iter(ts)
    x = next(it)
    w, b = (next(it), next(it)) if affine else (None, None)
    mean, var = (next(it), next(it)) if track else (None, None)
    return x, w, b, mean, var


def _grad_samples():
    def build(dy, x, w, b):
        _, mean, invstd = create_op(
            BATCH_NORM_TRAINING,
            [x, w, b],
            {"epsilon": 1e-5, "momentum": 0.1, "affine": True, "track": False},
        )
        return tuple(
            create_op(
                BATCH_NORM_TRAINING_GRAD,
                [dy, x, w, mean, invstd],
                {"epsilon": 1e-5, "affine": True},
            )
        )

    def ref(dy, x, w, b):
        x, w, b = (t.detach().requires_grad_() for t in (x, w, b))
        with torch.enable_grad():
            return torch.autograd.grad(F.batch_norm(x, None, None, w, b, True), (x, w, b), dy)

    inputs = [
        rand(4, 3, 2, 2, seed=130),
        rand(4, 3, 2, 2, seed=131),
        rand(3, low=0.5, high=1.5, seed=132),
        rand(3, seed=133),
    ]
    return [Sample(inputs, build, ref, grad=False, rtol=0.0, atol=0.0)]


BATCH_NORM_TRAINING = register(
    OpDef(
        "BatchNormalizationTraining",
        _infer,
        _kernel,
        grad=_grad,
        cost=_cost(7),
        samples=_samples,
        out_name="batch_norm_out",
        fresh_outputs=True,  # native_batch_norm's results and the running statistics' clones
    )
)
BATCH_NORM_TRAINING_GRAD = register(
    OpDef(
        "BatchNormalizationTrainingGrad",
        _grad_infer,
        _grad_kernel,
        cost=_cost(8),
        samples=_grad_samples,
        out_name="batch_norm_grad_out",
        fresh_outputs=True,  # native_batch_norm_backward's results
    )
)


def batch_norm_training(
    t: Tensor,
    scale: Tensor | None = None,
    bias: Tensor | None = None,
    running_mean: Tensor | None = None,
    running_var: Tensor | None = None,
    epsilon: float = 1e-5,
    momentum: float | None = 0.1,
    num_batches: Tensor | None = None,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Training-mode batch norm over dim 1 of ``t``, with torch's semantics.

    Returns ``(y, new_running_mean, new_running_var)``; the running statistics are None when
    none are given. ``momentum`` weighs the batch statistics as in torch
    (``new = (1 - momentum) * old + momentum * batch``); ``momentum=None`` is torch's
    cumulative average, with ``num_batches`` (the updated count) giving the factor.
    """
    affine, track = scale is not None, running_mean is not None
    if (bias is not None) != affine or (running_var is not None) != track:
        raise ValueError(
            "batch_norm_training: give scale with bias, and running_mean with "
            "running_var (or neither)"
        )
    if track and momentum is None and num_batches is None:
        raise ValueError("batch_norm_training: momentum=None needs num_batches")
    # scale, bias, running_mean and running_var are not None where taken (checked above)
    ins: list = (
        [t] + ([scale, bias] if affine else []) + ([running_mean, running_var] if track else [])
    )
    ins += [num_batches] if track and momentum is None else []
    attrs = {
        "epsilon": float(epsilon),
        "momentum": None if momentum is None else float(momentum),
        "affine": affine,
        "track": track,
    }
    outs = create_op(BATCH_NORM_TRAINING, ins, attrs)
    return (outs[0], outs[3], outs[4]) if track else (outs[0], None, None)
