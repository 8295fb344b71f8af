"""Softmax cross entropy, as a loss and as a loss plus its hand-computed logits gradient."""

from __future__ import annotations

from typing import Literal

from popxl_core import Tensor, constant, float32, ops

__all__ = ["cross_entropy", "cross_entropy_with_grad"]

Reduction = Literal["mean", "sum", "none"]


def cross_entropy_with_grad(
    x: Tensor,
    labels: Tensor,
    loss_scaling: float | Tensor = 1,
    ignore_index: int | None = None,
    reduction: Reduction = "mean",
) -> tuple[Tensor, Tensor]:
    """Cross entropy of logits ``x`` (classes on the last axis) and its gradient w.r.t. ``x``.

    The gradient comes from one fused op (no autodiff needed) and is multiplied by
    ``loss_scaling``; the loss is not.

    Returns:
        ``(loss, dx)``: the loss (scalar unless ``reduction='none'``) and dL/dx * loss_scaling.
    """
    probs = ops.softmax(x, -1)
    if not isinstance(loss_scaling, Tensor):
        loss_scaling = constant(loss_scaling, float32, name="loss_scaling")
    return ops.nll_loss_with_softmax_grad(
        probs, labels, loss_grad=loss_scaling, ignore_index=ignore_index, reduction=reduction
    )


def cross_entropy(
    x: Tensor, labels: Tensor, ignore_index: int | None = None, reduction: Reduction = "mean"
) -> Tensor:
    """Cross entropy of logits ``x`` (classes on the last axis), differentiable by autodiff."""
    # log_softmax + nll(log_prob=True) is stable where softmax rounds a probability to 0.
    logp = ops.log_softmax(x, -1)
    return ops.nll_loss(logp, labels, ignore_index=ignore_index, reduction=reduction, log_prob=True)
