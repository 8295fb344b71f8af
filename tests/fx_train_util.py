"""Train a copy of a model with popxl_fx (or eagerly, by hand) and return what the option
tests compare: the losses per step and the final state_dict."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

import popxl_fx

__all__ = ["eager_step", "max_diff", "train_eager", "train_fx"]


def train_fx(
    model: nn.Module,
    batches: Sequence[tuple],
    loss_fn: Callable | None,
    optimizer: Callable,
    **options,
) -> tuple[list[torch.Tensor], dict, popxl_fx.Trainer]:
    """``len(batches)`` steps of ``training_model`` on a copy of ``model``."""
    m = copy.deepcopy(model)
    trainer = popxl_fx.training_model(
        m, optimizer(m.parameters()), loss_fn, popxl_fx.Options(device="cpu", **options)
    )
    losses = [trainer(*batch) for batch in batches]
    return losses, copy.deepcopy(m.state_dict()), trainer


def train_eager(
    model: nn.Module,
    batches: Sequence[tuple],
    optimizer: Callable,
    step_grads: Callable[[nn.Module, tuple], torch.Tensor],
) -> tuple[list[torch.Tensor], dict]:
    """Eager steps on a copy of ``model``: ``step_grads(model, batch)`` sets ``.grad`` of the
    parameters (by hand: slices, half copies, ...) and returns the step's loss."""
    m = copy.deepcopy(model)
    opt = optimizer(m.parameters())
    losses = []
    for batch in batches:
        opt.zero_grad(set_to_none=True)
        losses.append(step_grads(m, batch).detach())
        opt.step()
    return losses, copy.deepcopy(m.state_dict())


def eager_step(model: nn.Module, opt, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One eager training step with cross entropy; returns the detached loss."""
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.detach()


def max_diff(a: dict | Sequence, b: dict | Sequence) -> float:
    """The largest absolute difference between two state_dicts (or loss lists)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        pairs = [(a[k], b[k]) for k in a]
    else:
        pairs = list(zip(a, b))
    return max(float((x.double() - y.double()).abs().max()) for x, y in pairs)
