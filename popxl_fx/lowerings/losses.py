"""Losses with torch's semantics: cross_entropy (class-index or probability targets, weight,
ignore_index, label_smoothing, any reduction, (N, C, d...) inputs), nll_loss, mse, l1,
smooth_l1, huber, kl_div, binary_cross_entropy (log clamped at -100, as torch) and
binary_cross_entropy_with_logits (pos_weight), as functions and as leaf modules."""

from __future__ import annotations

from typing import Literal, cast

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn import _reduction

import popxl_core as popxl
from popxl_core import ops
from popxl_core.ops.nll_direct import nll_with_direct_grad
from popxl_core.ops.scatter import gather_elements

from ..lowering import lowers
from ._common import const, promote
from .aten_kernels import lower_torch_function, torch_call

__all__ = ["cross_entropy", "nll_loss"]


def _reduction_of(reduction: str, size_average=None, reduce=None) -> str:
    if size_average is not None or reduce is not None:
        return _reduction.legacy_get_string(size_average, reduce, emit_warning=False)
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
    return reduction


def _reduce(loss, reduction: str):
    if reduction == "none":
        return loss
    return ops.sum(loss) if reduction == "sum" else ops.mean(loss)


def _class_last(x):
    """Move the class dim (1, or 0 when unbatched) of a rank >= 2 input to the end."""
    if x.rank <= 2:
        return x
    return ops.transpose(x, [0, *range(2, x.rank), 1])


def _picked(logp, target, weight, ignore_index: int):
    """(-log p of the target class, its weight incl. the ignore mask) per element."""
    valid = ops.logical_not(ops.equal(target, const(ignore_index, target.dtype)))
    safe = ops.where(valid, target, const(0, target.dtype))
    lp = _class_last(logp)
    picked = ops.squeeze(gather_elements(lp, ops.unsqueeze(safe, safe.rank), lp.rank - 1), [-1])
    w = ops.cast(valid, logp.dtype)
    if weight is not None:
        w = w * ops.gather(weight, safe, 0)
    return ops.negate(picked) * w, w


def nll_loss(
    logp: popxl.Tensor,
    target: popxl.Tensor,
    weight: popxl.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> popxl.Tensor:
    """torch's nll_loss on log-probabilities (classes in dim 1, or 0 when unbatched)."""
    if not target.dtype.is_int:
        raise TypeError(f"nll_loss targets must be class indices, got {target.dtype.name}")
    if weight is None and logp.rank == 2 and reduction != "none":
        mode = cast(Literal["mean", "sum", "none"], reduction)  # one of torch's three
        return ops.nll_loss(logp, target, ignore_index, mode, log_prob=True)
    loss, w = _picked(logp, target, weight, ignore_index)
    if reduction == "mean":
        return ops.sum(loss) / ops.sum(w)
    return _reduce(loss, reduction)


def _smooth_index(logp, target, weight, ignore_index, reduction, eps):
    """torch's label-smoothing term for class-index targets."""
    cdim = 1 if logp.rank >= 2 else 0
    lp = logp
    if weight is not None:
        lp = lp * ops.reshape(weight, [-1 if d == cdim else 1 for d in range(logp.rank)])
    smooth = ops.negate(ops.sum(lp, cdim))
    valid = ops.logical_not(ops.equal(target, const(ignore_index, target.dtype)))
    smooth = ops.where(valid, smooth, const(0.0, logp.dtype))
    if reduction == "mean":
        _, w = _picked(logp, target, weight, ignore_index)
        red = ops.sum(smooth) / ops.sum(w)
    else:
        red = _reduce(smooth, reduction)
    return red * (eps / logp.shape[cdim])


def _prob_targets(logp, target, weight, reduction, eps):
    cdim = 1 if logp.rank >= 2 else 0
    n_classes = logp.shape[cdim]
    if eps > 0:
        target = target * (1.0 - eps) + eps / n_classes
    prod = logp * target
    if weight is not None:
        prod = prod * ops.reshape(weight, [-1 if d == cdim else 1 for d in range(logp.rank)])
    loss = ops.negate(ops.sum(prod, cdim))
    return _reduce(loss, reduction)


def cross_entropy(
    x: popxl.Tensor,
    target: popxl.Tensor,
    weight: popxl.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    eps: float = 0.0,
) -> popxl.Tensor:
    cdim = 1 if x.rank >= 2 else 0
    if _direct(x, target, weight, reduction, eps):
        return nll_with_direct_grad(ops.softmax(x, cdim), target, x, ignore_index, reduction)
    logp = ops.log_softmax(x, cdim)
    if target.dtype.is_floating_point:
        return _prob_targets(logp, target, weight, reduction, eps)
    loss = nll_loss(logp, target, weight, ignore_index, reduction)
    if eps == 0:
        return loss
    smooth = _smooth_index(logp, target, weight, ignore_index, reduction, eps)
    return loss * (1.0 - eps) + smooth


def _direct(x, target, weight, reduction: str, eps: float) -> bool:
    """Under ``Options(numerics="ipu")`` the plain class-index cross entropy of 2-d logits
    takes its gradient as the IPU does (PopART's NlllWithSoftmaxGradDirect,
    `popxl_core.ops.nll_direct`): ``(softmax - onehot) / n``, not autodiff's log-softmax
    backward; under ``"torch"`` eager's kernels."""
    simple = weight is None and eps == 0 and reduction in ("mean", "sum") and x.rank == 2
    ipu = popxl.gcg().ir.numerics == "ipu"
    return ipu and simple and not target.dtype.is_floating_point


@lowers(F.cross_entropy)
def _cross_entropy(
    ctx,
    x,
    target,
    weight=None,
    size_average=None,
    ignore_index=-100,
    reduce=None,
    reduction="mean",
    label_smoothing=0.0,
):
    red = _reduction_of(reduction, size_average, reduce)
    return cross_entropy(x, target, weight, ignore_index, red, float(label_smoothing))


@lowers(F.nll_loss)
def _nll_loss(
    ctx, x, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"
):
    return nll_loss(x, target, weight, ignore_index, _reduction_of(reduction, size_average, reduce))


def _buffer(ctx, m, name: str):
    return ctx.buffer(name) if getattr(m, name, None) is not None else None


@lowers(nn.CrossEntropyLoss)
def _cross_entropy_module(ctx, m, x, target):
    return cross_entropy(
        x, target, _buffer(ctx, m, "weight"), m.ignore_index, m.reduction, m.label_smoothing
    )


@lowers(nn.NLLLoss)
def _nll_module(ctx, m, x, target):
    return nll_loss(x, target, _buffer(ctx, m, "weight"), m.ignore_index, m.reduction)


# regression losses ---------------------------------------------------------------------------
def _diff(x, target):
    x, target = promote(x, target)
    return x - target


def huber(d: popxl.Tensor, delta: float) -> popxl.Tensor:
    a = ops.abs(d)
    quad = d * d * 0.5
    return ops.where(ops.less(a, const(delta, d.dtype)), quad, (a - 0.5 * delta) * delta)


def smooth_l1(d: popxl.Tensor, beta: float) -> popxl.Tensor:
    if beta == 0:
        return ops.abs(d)
    a = ops.abs(d)
    return ops.where(ops.less(a, const(beta, d.dtype)), d * d * (0.5 / beta), a - 0.5 * beta)


def _pointwise(name: str, fn):
    def lower(ctx, x, target, *args, size_average=None, reduce=None, reduction="mean", **kwargs):
        red = _reduction_of(reduction, size_average, reduce)
        return _reduce(fn(_diff(x, target), *args, **kwargs), red)

    lower.__name__ = f"_{name}"
    return lower


lowers(F.mse_loss)(_pointwise("mse", lambda d, weight=None: d * d))
lowers(F.l1_loss)(_pointwise("l1", lambda d: ops.abs(d)))
lowers(F.smooth_l1_loss)(_pointwise("smooth_l1", lambda d, beta=1.0: smooth_l1(d, beta)))
lowers(F.huber_loss)(_pointwise("huber", lambda d, delta=1.0, weight=None: huber(d, delta)))


@lowers(nn.MSELoss)
def _mse_module(ctx, m, x, target):
    d = _diff(x, target)
    return _reduce(d * d, m.reduction)


@lowers(nn.L1Loss)
def _l1_module(ctx, m, x, target):
    return _reduce(ops.abs(_diff(x, target)), m.reduction)


@lowers(nn.SmoothL1Loss)
def _smooth_l1_module(ctx, m, x, target):
    return _reduce(smooth_l1(_diff(x, target), m.beta), m.reduction)


@lowers(nn.HuberLoss)
def _huber_module(ctx, m, x, target):
    return _reduce(huber(_diff(x, target), m.delta), m.reduction)


def kl_div(
    x: popxl.Tensor, target: popxl.Tensor, reduction: str = "mean", log_target: bool = False
) -> popxl.Tensor:
    if log_target:
        loss = ops.exp(target) * (target - x)
    else:
        positive = ops.greater(target, const(0.0, target.dtype))
        safe = ops.where(positive, target, const(1.0, target.dtype))
        loss = ops.where(positive, target * (ops.log(safe) - x), const(0.0, x.dtype))
    if reduction == "batchmean":
        return ops.sum(loss) * (1.0 / x.shape[0]) if x.rank else ops.sum(loss)
    return _reduce(loss, reduction)


@lowers(F.kl_div)
def _kl_div(ctx, x, target, size_average=None, reduce=None, reduction="mean", log_target=False):
    red = reduction if reduction == "batchmean" else _reduction_of(reduction, size_average, reduce)
    return kl_div(x, target, red, log_target)


@lowers(nn.KLDivLoss)
def _kl_div_module(ctx, m, x, target):
    return kl_div(x, target, m.reduction, m.log_target)


# binary cross entropy ------------------------------------------------------------------------
# torch's own kernels, forward and backward: eager's binary_cross_entropy computes
# (t - 1) * max(log1p(-p), -100) - t * max(log(p), -100) in one loop, and its _with_logits
# form (1 - t) * x - log_sigmoid(x) * (1 + (pw - 1) * t), each with a fused backward kernel
# (binary_cross_entropy[_with_logits]_backward); a composite of PopXL ops rounds in another
# order (up to 2e-7 forward, 5e-7 gradient) where eager's arithmetic is available to match.
def bce(
    p: popxl.Tensor,
    target: popxl.Tensor,
    weight: popxl.Tensor | None = None,
    reduction: str = "mean",
) -> popxl.Tensor:
    """torch's binary_cross_entropy (each log clamped at -100, as torch)."""
    return torch_call(F.binary_cross_entropy, p, target, weight, reduction=reduction)


def bce_with_logits(
    x: popxl.Tensor,
    target: popxl.Tensor,
    weight: popxl.Tensor | None = None,
    pos_weight: popxl.Tensor | None = None,
    reduction: str = "mean",
) -> popxl.Tensor:
    """torch's binary_cross_entropy_with_logits (``pos_weight`` broadcast on the last dim)."""
    return torch_call(
        F.binary_cross_entropy_with_logits,
        x,
        target,
        weight,
        reduction=reduction,
        pos_weight=pos_weight,
    )


@lowers(F.binary_cross_entropy)
def _bce(ctx, p, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    return bce(p, target, weight, _reduction_of(reduction, size_average, reduce))


@lowers(F.binary_cross_entropy_with_logits)
def _bce_logits(
    ctx, x, target, weight=None, size_average=None, reduce=None, reduction="mean", pos_weight=None
):
    red = _reduction_of(reduction, size_average, reduce)
    return bce_with_logits(x, target, weight, pos_weight, red)


# torch's own name for the same kernel (F's function without its size check): the fallback
# cannot keep it whole (functorch's functionalize decomposes it)
lowers(torch.binary_cross_entropy_with_logits)(lower_torch_function)


@lowers(nn.BCELoss)
def _bce_module(ctx, m, p, target):
    return bce(p, target, _buffer(ctx, m, "weight"), m.reduction)


@lowers(nn.BCEWithLogitsLoss)
def _bce_logits_module(ctx, m, x, target):
    return bce_with_logits(
        x, target, _buffer(ctx, m, "weight"), _buffer(ctx, m, "pos_weight"), m.reduction
    )
