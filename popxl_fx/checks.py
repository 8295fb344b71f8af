"""Checks of a training step's inputs: clear errors in torch's terms.

`check_inputs` runs before anything is built; `check_target` runs while the loss wrapper is
traced, on the model output's example value (the trace computes it anyway: no extra run of
the model), before the loss function sees a target of the wrong shape.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from .errors import Issue

__all__ = [
    "check_inputs",
    "check_no_autocast",
    "check_step_arity",
    "check_target",
    "dtype_issues",
    "integer_inputs_explained",
]

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
    """Every input of a step is a tensor, and every tensor has a dtype the IPU has."""
    for i, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor):
            raise TypeError(
                f"input {i} is a {type(x).__name__}; popxl_fx steps take torch tensors."
            )
    issues = dtype_issues(model, inputs)
    if issues:
        raise TypeError(f"{issues[0].what}; {issues[0].hint}")


_NO_IPU_DTYPE = {torch.bfloat16, torch.complex64, torch.complex128}


def _dtype_issue(what: str, dtype: torch.dtype, fix: str) -> Issue:
    return Issue(
        "unsupported dtype",
        f"{what} is {dtype}",
        "<unknown>",
        hint=f"the simulated IPU has no {dtype}: use float32 or float16 ({fix}).",
    )


def dtype_issues(model: nn.Module, inputs: Sequence[object]) -> list[Issue]:
    """Inputs, parameters and buffers whose dtype popxl has no equivalent for (bfloat16)."""
    issues = [
        _dtype_issue(f"input {i}", x.dtype, f"x.float() for input {i}")
        for i, x in enumerate(inputs)
        if isinstance(x, torch.Tensor) and x.dtype in _NO_IPU_DTYPE
    ]
    for kind, named in (("parameter", model.named_parameters), ("buffer", model.named_buffers)):
        issues += [
            _dtype_issue(f"{kind} '{n}'", t.dtype, "model.float() or model.half()")
            for n, t in named()
            if t.dtype in _NO_IPU_DTYPE
        ]
    return issues


def check_no_autocast(what: str) -> None:
    """torch.autocast changes the dtypes eager computes in; the program was built in the
    parameters' own dtypes, so under autocast it could not give eager's numbers."""
    if torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda"):
        raise RuntimeError(
            f"{what} was called inside torch.autocast: the simulated IPU program computes in "
            "the model's own dtypes (float32 or float16), not autocast's. Call it outside the "
            "autocast block (half precision: model.half() and float16 inputs)."
        )


def check_step_arity(
    model: nn.Module, inputs: Sequence[object], loss_fn: object, n_keywords: int = 0
) -> None:
    """With ``loss_fn`` a step takes the model's inputs then one target: a missing or extra
    target is named here, not by forward's argument error. ``n_keywords`` of the inputs
    (before the target) were passed to the model by keyword."""
    if loss_fn is None:
        _check_no_target(model, len(inputs) - n_keywords)
        return
    inputs = [*inputs[: len(inputs) - 1 - n_keywords], inputs[-1]] if inputs else inputs
    low, high = _positional_range(model)
    name = getattr(loss_fn, "__name__", type(loss_fn).__name__)
    shape = "trainer(*model_inputs, target)"
    if len(inputs) - 1 < low:
        raise TypeError(
            f"the trainer got {len(inputs)} tensor(s), but with loss_fn={name} it takes "
            f"{type(model).__name__}'s {low} input(s) and then the target: {shape}."
        )
    if high is not None and len(inputs) - 1 > high:
        raise TypeError(
            f"the trainer got {len(inputs)} tensors: {type(model).__name__}.forward takes at "
            f"most {high} input(s), and with loss_fn={name} only the last tensor is the "
            f"target ({shape}); pass one target."
        )


def _check_no_target(model: nn.Module, n_positional: int) -> None:
    """Without ``loss_fn`` every tensor goes to forward, which returns the loss: one tensor
    more than forward takes is most likely a target meant for a loss function."""
    low, high = _positional_range(model)
    if high is None or n_positional <= high:
        return
    name = type(model).__name__
    raise TypeError(
        f"the trainer got {n_positional} positional tensor(s), but {name}.forward takes at most "
        f"{high}, and no loss_fn was given: without one, forward's output is the loss, so "
        f"{name} has no loss here. To compute the loss from its output and a target, pass a "
        "loss function: training_model(model, optimizer, loss_fn=...) and call "
        "trainer(*model_inputs, target)."
    )


def _positional_range(model: nn.Module) -> tuple[int, int | None]:
    """How many positional tensors ``model.forward`` needs at least and takes at most."""
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return 0, None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return sum(p.default is p.empty for p in positional), None
    return sum(p.default is p.empty for p in positional), len(positional)


@contextmanager
def integer_inputs_explained(model: nn.Module, model_inputs: Sequence[torch.Tensor]):
    """Turns torch's failure on an integer input to a float model, or a float input of
    another precision (float64 into a float32 model), met while the model is traced on its
    example inputs, into a TypeError that names the input."""
    try:
        yield
    except RuntimeError as e:
        if type(e) is not RuntimeError:  # a raised error of its own kind says what it means
            raise
        dtype = _float_dtype(model)
        ints = [i for i, x in enumerate(model_inputs) if not x.is_floating_point()]
        floats = [i for i, x in enumerate(model_inputs) if x.is_floating_point()]
        other = [i for i in floats if model_inputs[i].dtype != dtype]
        if dtype is None or not (ints or other):
            raise
        i = (ints or other)[0]
        kind = "a float tensor" if ints else f"a {dtype} tensor"
        raise TypeError(
            f"input {i} of {type(model).__name__} has dtype {model_inputs[i].dtype}, but the "
            f"model computes in {dtype}; pass {kind} (x.to({dtype})). torch says: {e}"
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
    labels = tuple(out.shape[:1] + out.shape[2:])
    if kind == "class" and target.is_floating_point() and tuple(target.shape) == labels:
        raise ValueError(
            f"{name} takes int64 class indices (shape {labels}) "
            f"or float class probabilities of the output's shape {tuple(out.shape)}; the target "
            f"is {target.dtype} of shape {tuple(target.shape)}: for class labels pass "
            "target.long()."
        )
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
