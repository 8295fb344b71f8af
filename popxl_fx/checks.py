"""Checks of a training step's inputs: clear errors in torch's terms.

`check_inputs` runs before anything is built; `check_target` runs while the loss wrapper is
traced, on the model output's example value (the trace computes it anyway: no extra run of
the model), before the loss function sees a target of the wrong shape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["check_inputs", "check_target", "integer_inputs_explained"]

_ELEMENTWISE = (
    nn.MSELoss,
    nn.L1Loss,
    nn.SmoothL1Loss,
    nn.HuberLoss,
    nn.BCELoss,
    nn.BCEWithLogitsLoss,
)
_ELEMENTWISE_FNS = (
    F.mse_loss,
    F.l1_loss,
    F.smooth_l1_loss,
    F.huber_loss,
    F.binary_cross_entropy,
    F.binary_cross_entropy_with_logits,
)
_CLASS = (nn.CrossEntropyLoss, nn.NLLLoss)
_CLASS_FNS = (F.cross_entropy, F.nll_loss)


def _float_dtype(model: nn.Module) -> torch.dtype | None:
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), None)


def check_inputs(model: nn.Module, inputs: Sequence[object]) -> None:
    """Every input of a step is a tensor."""
    for i, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor):
            raise TypeError(
                f"input {i} is a {type(x).__name__}; popxl_fx steps take torch tensors."
            )


@contextmanager
def integer_inputs_explained(model: nn.Module, model_inputs: Sequence[torch.Tensor]):
    """Turns torch's failure on an integer input to a float model (met while the model is
    traced on its example inputs) into a TypeError that names the input."""
    try:
        yield
    except RuntimeError as e:
        ints = [i for i, x in enumerate(model_inputs) if not x.is_floating_point()]
        dtype = _float_dtype(model)
        if not ints or dtype is None:
            raise
        i = ints[0]
        raise TypeError(
            f"input {i} of {type(model).__name__} has dtype {model_inputs[i].dtype}, but the "
            f"model computes in {dtype}; pass a float tensor (x.to({dtype})). torch says: {e}"
        ) from None


def _loss_kind(loss_fn: Callable) -> str | None:
    if isinstance(loss_fn, _ELEMENTWISE) or loss_fn in _ELEMENTWISE_FNS:
        return "elementwise"
    if isinstance(loss_fn, _CLASS) or loss_fn in _CLASS_FNS:
        return "class"
    return None


def _expected_target(kind: str, out: torch.Tensor, target: torch.Tensor) -> tuple:
    shape = tuple(out.shape)
    if kind == "class" and not target.is_floating_point():
        return shape[:1] + shape[2:] if len(shape) >= 2 else ()
    return shape


def check_target(out: object, target: object, loss_fn: Callable) -> None:
    """The target has the shape ``loss_fn`` needs for the model's output ``out`` (values or
    their shapes and dtypes only: the arithmetic of an unknown loss runs on "meta" copies)."""
    if not isinstance(out, torch.Tensor) or not isinstance(target, torch.Tensor):
        return
    name = getattr(loss_fn, "__name__", type(loss_fn).__name__)
    kind = _loss_kind(loss_fn)
    if kind is not None:
        expected = _expected_target(kind, out, target)
        if tuple(target.shape) != expected:
            raise ValueError(
                f"the target has shape {tuple(target.shape)}, but {name} of the model's output "
                f"(shape {tuple(out.shape)}) needs a target of shape {expected}."
            )
        return
    try:
        with torch.no_grad():
            loss_fn(out.to("meta"), target.to("meta"))
    except RuntimeError as e:
        raise ValueError(
            f"{name} cannot take the model's output (shape {tuple(out.shape)}) with the target "
            f"(shape {tuple(target.shape)}): {e}"
        ) from None
