"""The negative log likelihood losses (softmax and log_softmax, in softmax.py, are re-exported).

``nll_loss`` takes *probabilities* (``log_prob=True``: log-probabilities) with the classes on the
last axis and int32 labels of the remaining shape, like PopART's Nll. Ignored labels contribute
nothing, and 'mean' divides by the number of labels that are not ignored (at least 1).
"""

from __future__ import annotations

import math
from typing import Any, Dict, Literal

import numpy as np
import torch
import torch.nn.functional as F

from ..sim.speed import declare
from ..tensor import Tensor
from ._nll_fold import folded_nll, folded_nll_grad, nll_grad_rows, nll_rows
from ._nll_labels import (
    _aten_nll,
    aten_nll_backward,
    aten_nll_forward,
    check_labels,
    valid_labels,
)
from ._utils import rand, randint, spec
from .forms import ReplicaFold
from .registry import OpDef, Sample, create_op, register
from .softmax import log_softmax, softmax

__all__ = ["REDUCTION_TYPE", "log_softmax", "nll_loss", "nll_loss_with_softmax_grad", "softmax"]

REDUCTION_TYPE = Literal["mean", "sum", "none"]
_REDUCTIONS = ("mean", "sum", "none")


# shared NLL pieces -------------------------------------------------------------------------
def _check_nll(probs, labels) -> None:
    if not probs.dtype.is_floating_point:
        raise TypeError(f"probs must be floating point, got {probs.dtype.name}")
    if not labels.dtype.is_int:
        raise TypeError(
            f"labels must be an integer (int32) tensor of class indices, got "
            f"{labels.dtype.name}; cast them with ops.cast(labels, popxl.int32)"
        )
    if len(probs.shape) < 1 or tuple(labels.shape) != tuple(probs.shape[:-1]):
        raise ValueError(
            f"labels shape {labels.shape} must be probs shape {probs.shape} "
            "without its last (class) axis"
        )


def _pick(probs: torch.Tensor, labels: torch.Tensor, ignore_index):
    """probs[..., label] and the mask of labels that count."""
    lab = labels.long()
    valid = valid_labels(lab, ignore_index)
    check_labels(lab, valid, probs.shape[-1])
    safe = torch.where(valid, lab, torch.zeros_like(lab))  # ignored labels may be out of range
    return probs.gather(-1, safe.unsqueeze(-1)).squeeze(-1), valid, safe


def _count(valid: torch.Tensor, dtype) -> torch.Tensor:
    return valid.sum().clamp(min=1).to(dtype)


def _nll_value(probs, labels, reduction, ignore_index, log_prob):
    p, valid, _ = _pick(probs, labels, ignore_index)
    loss = torch.where(valid, -(p if log_prob else torch.log(p)), torch.zeros_like(p))
    if reduction == "none":
        return loss
    total = loss.sum()
    return total / _count(valid, total.dtype) if reduction == "mean" else total


def _check_attrs(reduction, ignore_index) -> None:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if ignore_index is not None and not isinstance(ignore_index, (int, np.integer)):
        raise TypeError(f"ignore_index must be an int or None, got {ignore_index!r}")


# Nll ------------------------------------------------------------------------------------
def _nll_infer(ins, reduction, ignore_index, log_prob):
    _check_nll(ins[0], ins[1])
    shape = tuple(ins[1].shape) if reduction == "none" else ()
    return [spec(shape, ins[0].dtype)]


def _nll_kernel(probs, labels, reduction, ignore_index, log_prob):
    if _aten_nll(probs, log_prob):
        (loss, _), *_ = aten_nll_forward(probs, labels, reduction, ignore_index)
        return loss
    return _nll_value(probs, labels, reduction, ignore_index, log_prob).to(probs.dtype)


def _nll_grad(ctx):
    a = ctx.attrs
    g = ctx.grad_output(0)
    out = create_op(NLL_GRAD, [ctx.input(0), ctx.input(1), g], dict(a))[0]
    return [out, None]


def _nll_grad_infer(ins, reduction, ignore_index, log_prob):
    return [ins[0]]


def _nll_grad_kernel(probs, labels, g, reduction, ignore_index, log_prob):
    """d loss / d probs: -g / p at the label (-g for log-probabilities), zero elsewhere."""
    if _aten_nll(probs, log_prob):
        return aten_nll_backward(probs, labels, g, reduction, ignore_index)
    p, valid, safe = _pick(probs, labels, ignore_index)
    scale = g / _count(valid, probs.dtype) if reduction == "mean" else g
    d = -scale * torch.ones_like(p) if log_prob else -scale / p
    d = torch.where(valid, d, torch.zeros_like(d))
    return torch.zeros_like(probs).scatter(-1, safe.unsqueeze(-1), d.unsqueeze(-1))


def _probs(*shape: int, seed: int) -> np.ndarray:
    x = rand(*shape, low=0.1, high=1.0, seed=seed)
    return (x / x.sum(-1, keepdims=True)).astype(np.float32)


def _torch_nll(p, labels, reduction="mean", ignore_index=None, log_prob=False):
    logp = p if log_prob else torch.log(p)
    # torch wants the class axis at dim 1.
    logp = logp.movedim(-1, 1) if logp.dim() > 2 else logp
    return F.nll_loss(
        logp,
        labels.long(),
        reduction=reduction,
        ignore_index=-100 if ignore_index is None else ignore_index,
    )


def _ignored_labels(seed: int) -> np.ndarray:
    lab = randint(6, high=4, seed=seed)
    lab[[1, 4]] = 2
    return lab


def _nll_samples():
    return [
        Sample(
            [_probs(5, 4, seed=310), randint(5, high=4, seed=311)],
            lambda p, lab: nll_loss(p, lab),
            _torch_nll,
            name="mean",
        ),
        Sample(
            [_probs(2, 3, 4, seed=312), randint(2, 3, high=4, seed=313)],
            lambda p, lab: nll_loss(p, lab, reduction="sum"),
            lambda p, lab: _torch_nll(p, lab, "sum"),
            name="sum_3d",
        ),
        Sample(
            [_probs(6, 4, seed=314), _ignored_labels(315)],
            lambda p, lab: nll_loss(p, lab, ignore_index=2),
            lambda p, lab: _torch_nll(p, lab, "mean", 2),
            name="ignore_mean",
        ),
        Sample(
            [_probs(6, 4, seed=316), _ignored_labels(317)],
            lambda p, lab: nll_loss(p, lab, ignore_index=2, reduction="none"),
            lambda p, lab: _torch_nll(p, lab, "none", 2),
            name="ignore_none",
        ),
        Sample(
            [np.log(_probs(5, 3, seed=318)), randint(5, high=3, seed=319)],
            lambda p, lab: nll_loss(p, lab, log_prob=True),
            lambda p, lab: _torch_nll(p, lab, log_prob=True),
            name="log_prob",
        ),
    ]


def _nll_grad_samples():
    def ref(p, lab, g, **kw):
        p = p.detach().requires_grad_()
        with torch.enable_grad():
            loss = _torch_nll(p, lab, **kw)
            return torch.autograd.grad(loss, p, g)[0]

    return [
        Sample(
            [_probs(6, 4, seed=320), _ignored_labels(321), rand(6, seed=322)],
            lambda p, lab, g: _nll_grad_op(p, lab, g, "none", 2, False),
            lambda p, lab, g: ref(p, lab, g, reduction="none", ignore_index=2),
            grad=False,
            name="none",
        ),
        Sample(
            [_probs(6, 4, seed=323), _ignored_labels(324), np.float32(0.7)],
            lambda p, lab, g: _nll_grad_op(p, lab, g, "mean", 2, True),
            lambda p, lab, g: ref(p, lab, g, reduction="mean", ignore_index=2, log_prob=True),
            grad=False,
            name="mean_log_prob",
        ),
    ]


NLL = register(
    OpDef(
        "Nll",
        _nll_infer,
        _nll_kernel,
        grad=_nll_grad,
        samples=_nll_samples,
        out_name="nll_out",
    )
)
declare(NLL, replica_fold=ReplicaFold(rows=nll_rows, kernels=(folded_nll(_nll_kernel),)))
NLL_GRAD = register(
    OpDef(
        "NllGrad",
        _nll_grad_infer,
        _nll_grad_kernel,
        samples=_nll_grad_samples,
        out_name="nllgrad_out",
    )
)
declare(
    NLL_GRAD,
    replica_fold=ReplicaFold(rows=nll_grad_rows, kernels=(folded_nll_grad(_nll_grad_kernel),)),
)


def _nll_grad_op(probs, labels, g, reduction, ignore_index, log_prob):
    attrs = {"reduction": reduction, "ignore_index": ignore_index, "log_prob": log_prob}
    return create_op(NLL_GRAD, [probs, labels, g], attrs)[0]


def nll_loss(
    probs: Tensor,
    labels: Tensor,
    ignore_index: int | None = None,
    reduction: REDUCTION_TYPE = "mean",
    log_prob: bool = False,
) -> Tensor:
    """Negative log likelihood of ``labels`` under ``probs`` (classes on the last axis)."""
    _check_attrs(reduction, ignore_index)
    attrs = {"reduction": reduction, "ignore_index": ignore_index, "log_prob": bool(log_prob)}
    return create_op(NLL, [probs, labels], attrs)[0]


# NlllWithSoftmaxGradDirect --------------------------------------------------------------
def _check_direct_labels(probs, labels) -> None:
    """PopART's direct op flattens the probabilities to (rows, classes) and the labels to
    (rows,), so any labels shape with one label per row is accepted (BERT's (N, 1) labels
    against (N, C) probabilities; (B, S) labels against (B * S, C))."""
    rows = math.prod(probs.shape[:-1]) if len(probs.shape) else 0
    if len(probs.shape) >= 1 and labels.nelms == rows:
        _check_nll(spec(probs.shape, probs.dtype), spec(probs.shape[:-1], labels.dtype))
        return
    _check_nll(probs, labels)


def _direct_infer(ins, reduction, ignore_index, loss_grad):
    _check_direct_labels(ins[0], ins[1])
    if len(ins) == 3 and ins[2].nelms != 1:
        raise ValueError(f"loss_grad must hold one value, got shape {ins[2].shape}")
    shape = tuple(ins[1].shape) if reduction == "none" else ()
    return [spec(shape, ins[0].dtype), ins[0]]


def _direct_kernel(probs, labels, *loss_grad_t, reduction, ignore_index, loss_grad):
    """The loss (of the labels' shape, unreduced) and dL/dlogits; probabilities and labels
    taken as (rows, classes) and (rows,) (`_check_direct_labels`)."""
    if tuple(labels.shape) == tuple(probs.shape[:-1]):
        return _direct_rows(probs, labels, *loss_grad_t, reduction, ignore_index, loss_grad)
    rows = _direct_rows(
        probs.reshape(-1, probs.shape[-1]),
        labels.reshape(-1),
        *loss_grad_t,
        reduction,
        ignore_index,
        loss_grad,
    )
    loss = rows[0].reshape(labels.shape) if reduction == "none" else rows[0]
    return loss, rows[1].reshape(probs.shape)


def _direct_rows(probs, labels, *rest):
    *loss_grad_t, reduction, ignore_index, loss_grad = rest
    if ignore_index is None:
        return _direct_kernel_all_valid(probs, labels, loss_grad_t, reduction, loss_grad)
    loss = _nll_value(probs, labels, reduction, ignore_index, False)
    _, valid, safe = _pick(probs, labels, ignore_index)
    onehot = torch.zeros_like(probs).scatter(-1, safe.unsqueeze(-1), 1.0)
    scale = loss_grad_t[0].reshape(()).to(probs.dtype) if loss_grad_t else loss_grad
    if reduction == "mean":
        scale = scale / _count(valid, probs.dtype)
    dlogits = (probs - onehot) * valid.unsqueeze(-1).to(probs.dtype) * scale
    return loss.to(probs.dtype), dlogits.to(probs.dtype)


def _direct_kernel_all_valid(probs, labels, loss_grad_t, reduction, loss_grad):
    """The common case, no ignored labels: fewer kernels on the training hot path."""
    lab = labels.long().unsqueeze(-1)
    loss = -torch.log(probs.gather(-1, lab)).squeeze(-1)
    scale = loss_grad_t[0].reshape(()).to(probs.dtype) if loss_grad_t else loss_grad
    if reduction != "none":
        loss = loss.sum()
    if reduction == "mean":
        count = max(labels.numel(), 1)
        loss, scale = loss / count, scale / count
    dlogits = probs.scatter_add(-1, lab, torch.full_like(lab, -1, dtype=probs.dtype)) * scale
    return loss.to(probs.dtype), dlogits.to(probs.dtype)


def _direct_samples():
    def ref(logits, lab, g=None, *, lg=1.0, reduction="mean", ignore_index=None):
        x = logits.detach().requires_grad_()
        with torch.enable_grad():
            loss = F.cross_entropy(
                x,
                lab.long(),
                reduction=reduction,
                ignore_index=-100 if ignore_index is None else ignore_index,
            )
            scale = g if g is not None else torch.tensor(lg)
            dx = torch.autograd.grad(loss, x, torch.ones_like(loss) * scale)[0]
        return loss.detach(), dx

    logits = rand(6, 4, low=-2, high=2, seed=330)
    return [
        Sample(
            [logits, randint(6, high=4, seed=331)],
            lambda x, lab: nll_loss_with_softmax_grad(softmax(x, 1), lab),
            ref,
            grad=False,
            name="mean",
        ),
        Sample(
            [logits, _ignored_labels(332)],
            lambda x, lab: nll_loss_with_softmax_grad(softmax(x, -1), lab, 0.5, 2, "sum"),
            lambda x, lab: ref(x, lab, lg=0.5, reduction="sum", ignore_index=2),
            grad=False,
            name="sum_ignore",
        ),
        Sample(
            [logits, _ignored_labels(333), np.float32(1.5)],
            lambda x, lab, g: nll_loss_with_softmax_grad(softmax(x, -1), lab, g, 2),
            lambda x, lab, g: ref(x, lab, g, ignore_index=2),
            grad=False,
            name="tensor_loss_grad",
        ),
        Sample(
            [logits, randint(6, high=4, seed=334)],
            lambda x, lab: nll_loss_with_softmax_grad(softmax(x, -1), lab, 2.0, reduction="none"),
            lambda x, lab: ref(x, lab, lg=2.0, reduction="none"),
            grad=False,
            name="none",
        ),
        Sample(  # labels (N, 1) against probabilities (N, C), as PopART accepts (BERT)
            [logits, randint(6, 1, high=4, seed=335)],
            lambda x, lab: nll_loss_with_softmax_grad(softmax(x, -1), lab, 2.0, reduction="none"),
            lambda x, lab: (lambda r: (r[0].reshape(6, 1), r[1]))(
                ref(x, lab.reshape(6), lg=2.0, reduction="none")
            ),
            grad=False,
            name="labels_n1",
        ),
    ]


NLL_SOFTMAX_GRAD = register(
    OpDef(
        "NlllWithSoftmaxGradDirect",
        _direct_infer,
        _direct_kernel,
        samples=_direct_samples,
        out_name="nlllwithsoftmaxgraddirect_out",
    )
)


def nll_loss_with_softmax_grad(
    probs: Tensor,
    labels: Tensor,
    loss_grad: float | Tensor = 1,
    ignore_index: int | None = None,
    reduction: REDUCTION_TYPE = "mean",
) -> tuple[Tensor, Tensor]:
    """NLL of softmax ``probs`` and dL/dlogits of softmax+NLL, scaled by ``loss_grad``."""
    _check_attrs(reduction, ignore_index)
    inputs = [probs, labels]
    attrs: Dict[str, Any] = {
        "reduction": reduction,
        "ignore_index": ignore_index,
        "loss_grad": None,
    }
    if isinstance(loss_grad, Tensor):
        inputs.append(loss_grad)
    else:
        attrs["loss_grad"] = float(loss_grad)
    loss, dlogits = create_op(NLL_SOFTMAX_GRAD, inputs, attrs)
    return loss, dlogits
