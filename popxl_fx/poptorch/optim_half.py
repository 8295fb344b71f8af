"""The eager ``step`` of ``poptorch.optim``'s optimizers with PopTorch's accumulator dtypes:
what the IPU computes (`popxl_fx.optim_storage`), done with torch's own step.

Each float16 weight is stepped as a float32 copy (its gradient cast to float32), its state
read into float32; after torch's step the weight is rounded to float16 once and each state
tensor is stored in its accumulator dtype (float32 unless the optimizer was given
``torch.float16``). A weight that is float32 with float32 accumulators is stepped as is.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .. import optim_storage

__all__ = ["ipu_step"]


def ipu_step(optimizer, plain_step: Callable, closure=None):
    """``plain_step(closure)`` (torch's step) with PopTorch's dtypes for the update."""
    swaps = [
        (pg, i, p)
        for pg in optimizer.param_groups
        for i, p in enumerate(pg["params"])
        if _needs(pg, p)
    ]
    if not swaps:
        return plain_step(closure)
    loss = None
    if closure is not None:  # the closure's gradients land on the user's weights
        with torch.enable_grad():
            loss = closure()
    works = [_enter(optimizer, pg, i, p) for pg, i, p in swaps]
    try:
        plain_step(None)
    finally:
        for (pg, i, p), work in zip(swaps, works):
            _leave(optimizer, pg, i, p, work)
    return loss


def _needs(pg, p: torch.Tensor) -> bool:
    half_state = any(pg.get(k) == torch.float16 for k in optim_storage.DTYPE_KEYS)
    return p.dtype == torch.float16 or half_state


def _f32(value):
    floating = isinstance(value, torch.Tensor) and value.is_floating_point()
    return value.float() if floating else value


def _enter(optimizer, pg, i: int, p: torch.Tensor) -> torch.Tensor:
    """The float32 tensor stepped for ``p`` (put in its place, with its state)."""
    work = p if p.dtype == torch.float32 else p.detach().float()
    if work is not p:
        work.grad = None if p.grad is None else p.grad.float()
        pg["params"][i] = work
    state = optimizer.state.pop(p, None)
    if state:
        optimizer.state[work] = {k: _f32(v) for k, v in state.items()}
    return work


def _leave(optimizer, pg, i: int, p: torch.Tensor, work: torch.Tensor) -> None:
    """``p`` back in its place, rounded from ``work``; its state in the accumulator dtypes."""
    pg["params"][i] = p
    if work is not p:
        p.copy_(work)
    state = optimizer.state.pop(work, None)
    if state:
        optimizer.state[p] = {k: _stored(optimizer, pg, k, v) for k, v in state.items()}


def _stored(optimizer, pg, key: str, value):
    if not (isinstance(value, torch.Tensor) and value.is_floating_point()) or key == "step":
        return value
    return value.to(optim_storage.torch_stored_dtype(optimizer._kind, pg, key))
