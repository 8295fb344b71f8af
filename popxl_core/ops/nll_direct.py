"""NllWithDirectGrad: the NLL of softmax probabilities whose gradient goes straight to the
logits, ``(probs - onehot) * g / n`` in one op.

PopART rewrites softmax followed by NLL this way on the IPU (its NlllWithSoftmaxGradDirect
pattern), and hand-written PopXL programs compute it so (``addons.cross_entropy_with_grad``,
seed 003). This op makes that gradient part of autodiff: its inputs are the softmax
probabilities, the labels and the logits the probabilities came from; the forward is the loss
(the kernel of `losses.nll_loss_with_softmax_grad`), and its gradient rule gives the logits
that op's direct gradient and the probabilities none, so the softmax's own backward never
runs. `popxl_fx` lowers ``F.cross_entropy`` to it under ``Options(numerics="ipu")``.
"""

from __future__ import annotations

import torch.nn.functional as F

from ..tensor import Tensor
from ._utils import rand, randint, spec
from .losses import NLL_SOFTMAX_GRAD, _check_attrs, _check_nll, _direct_kernel, softmax
from .registry import OpDef, Sample, create_op, register

__all__ = ["nll_with_direct_grad"]


def _infer(ins, reduction, ignore_index):
    probs, labels, logits = ins
    _check_nll(probs, labels)
    if tuple(logits.shape) != tuple(probs.shape) or logits.dtype != probs.dtype:
        raise ValueError(
            f"logits {logits.shape} {logits.dtype.name} must be what the probabilities "
            f"{probs.shape} {probs.dtype.name} are the softmax of"
        )
    if reduction == "none":
        raise ValueError("nll_with_direct_grad reduces: give reduction 'mean' or 'sum'")
    return [spec((), probs.dtype)]


def _kernel(probs, labels, logits, reduction, ignore_index):
    return _direct_kernel(
        probs, labels, reduction=reduction, ignore_index=ignore_index, loss_grad=1.0
    )[0]


def _grad(ctx):
    a = ctx.attrs
    attrs = {"reduction": a["reduction"], "ignore_index": a["ignore_index"], "loss_grad": None}
    inputs = [ctx.input(0), ctx.input(1), ctx.grad_output(0)]
    dlogits = create_op(NLL_SOFTMAX_GRAD, inputs, attrs)[1]
    return [None, None, dlogits]


def _samples():
    def build(reduction, ignore_index=None):
        return lambda x, lab: nll_with_direct_grad(softmax(x, -1), lab, x, ignore_index, reduction)

    logits = rand(6, 4, low=-2, high=2, seed=340)
    labels = randint(6, high=4, seed=341)
    return [
        Sample(
            [logits, labels],
            build("mean"),
            lambda x, lab: F.cross_entropy(x, lab.long()),
            grad=False,
            name="mean",
        ),
        Sample(
            [logits, labels],
            build("sum", 2),
            lambda x, lab: F.cross_entropy(x, lab.long(), reduction="sum", ignore_index=2),
            grad=False,
            name="sum_ignore",
        ),
    ]


NLL_DIRECT = register(
    OpDef(
        "NllWithDirectGrad",
        _infer,
        _kernel,
        grad=_grad,
        samples=_samples,
        out_name="nllwithdirectgrad_out",
    )
)


def nll_with_direct_grad(
    probs: Tensor,
    labels: Tensor,
    logits: Tensor,
    ignore_index: int | None = None,
    reduction: str = "mean",
) -> Tensor:
    """The NLL of ``probs = softmax(logits)`` whose gradient is given to ``logits`` directly
    (``(probs - onehot) * g / n``, PopART's NlllWithSoftmaxGradDirect)."""
    _check_attrs(reduction, ignore_index)
    attrs = {"reduction": reduction, "ignore_index": ignore_index}
    return create_op(NLL_DIRECT, [probs, labels, logits], attrs)[0]
