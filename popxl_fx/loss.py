"""The loss wrapper of `training_model`: ``loss_fn(model(*inputs), target)`` as one module.

The loss is traced and lowered through the same table as the model (a loss module is a leaf,
a loss function a call). The capture calls the wrapper's ``forward(*inputs_and_target)``
with one placeholder per tensor (`popxl_fx.capture_calls`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator

import torch
import torch.utils._pytree as pytree
from torch import nn

import popxl_core as popxl

from .calls import POSITIONAL, Binding, loss_position
from .checks import check_target
from .errors import Issue, UnsupportedError

__all__ = ["PREFIX", "WithLoss", "check_scalar_loss", "loss_index", "user_terms", "with_loss"]

PREFIX = "model."  # where the model sits inside the loss wrapper


class WithLoss(nn.Module):
    """``loss_fn(model(*inputs), target)``; ``with_output`` also returns the model's output.
    ``binding`` says how the inputs reach ``model.forward`` (keyword tensors, constants)."""

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Callable,
        with_output: bool = False,
        binding: Binding = POSITIONAL,
    ) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn
        self.with_output = with_output
        self.binding = binding

    def forward(self, *inputs_and_target):
        # traced with one placeholder per tensor (`capture_calls`): inputs, then the target
        *inputs, target = inputs_and_target
        return self._loss(self.binding.call(self.model, *inputs), target)

    def _loss(self, out, target):
        # while traced, out and target are proxies carrying their example values
        check_target(_example_value(out), _example_value(target), self.loss_fn)
        loss = self.loss_fn(out, target)
        return (loss, out) if self.with_output else loss


def with_loss(
    model: nn.Module,
    loss_fn: Callable,
    n_inputs: int,
    with_output: bool = False,
    binding: Binding = POSITIONAL,
) -> WithLoss:
    """The loss wrapper for a model taking ``n_inputs`` tensors (1 or more)."""
    if not isinstance(n_inputs, int) or n_inputs < 1:
        raise ValueError(
            f"with loss_fn, the model takes at least one input besides the target (got "
            f"{n_inputs}); pass the inputs and then the target: trainer(x, target)."
        )
    return WithLoss(model, loss_fn, with_output, binding)


def _example_value(x: object) -> object:
    return x.node.meta.get("example_value") if isinstance(x, torch.fx.Proxy) else x


@contextlib.contextmanager
def user_terms(model: nn.Module, prefix: str) -> Iterator[None]:
    """Issues found in the loss wrapper, told in terms of the user's model: its class name,
    module paths and attributes without the wrapper's ``model.`` prefix."""
    try:
        yield
    except UnsupportedError as e:
        if not prefix:
            raise
        issues = [_unwrapped(issue, prefix) for issue in e.issues]
        raise UnsupportedError(type(model).__name__, issues) from None


def _unwrapped(issue: Issue, prefix: str) -> Issue:
    path = issue.module_path
    path = (
        path[len(prefix) :] if path.startswith(prefix) else ("" if path + "." == prefix else path)
    )
    return dataclasses.replace(issue, module_path=path, what=issue.what.replace(f"'{prefix}", "'"))


def loss_index(out_spec: pytree.TreeSpec, n_outputs: int, model: nn.Module) -> int:
    """Which flattened output is the loss: the tensor, ``out["loss"]``, ``out.loss`` (a
    ModelOutput, dataclass or namedtuple) or ``out[0]``."""
    where = loss_position(out_spec, n_outputs)
    if where is None:
        kind = type(pytree.tree_unflatten(list(range(n_outputs)), out_spec)).__name__
        raise ValueError(
            f"{type(model).__name__}.forward returns {kind} without a loss; return the loss "
            "(a tensor, a tuple starting with it, or a dict or ModelOutput with 'loss': "
            "HuggingFace models compute it when given labels=) or pass loss_fn=."
        )
    return where


def check_scalar_loss(loss: popxl.Tensor, model: nn.Module, has_loss_fn: bool) -> None:
    if loss.shape == () and loss.dtype.is_floating_point:
        return
    what = "loss_fn" if has_loss_fn else f"{type(model).__name__}.forward"
    hint = "reduce it (reduction='mean')" if has_loss_fn else "pass loss_fn=, e.g. F.cross_entropy"
    raise ValueError(
        f"training_model needs a scalar float loss, but {what} returns a tensor of shape "
        f"{tuple(loss.shape)} ({loss.dtype.name}); {hint}."
    )
