"""PopTorch's combined batch in, PopTorch's output modes out.

A PopTorch call takes every device iteration's inputs concatenated on dim 0:
``deviceIterations x replicationFactor x gradientAccumulation x micro-batch`` rows. popxl_fx
takes device iterations as a leading dimension (``[n, rows/n, ...]``) and splits the rest
over replicas and micro-batches itself. Outputs come back per iteration (``[n, ...]``) and
are returned as the output mode says: All (concatenated again), Final (the last iteration),
EveryN (every N-th, concatenated) or Sum (added over iterations).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree

from .enums import OutputMode
from .errors import Error

__all__ = ["combined_batch", "select_outputs", "split_iterations"]


def combined_batch(options, training: bool) -> int:
    """The number a call's dim 0 must be a multiple of."""
    k = options.Training.gradient_accumulation if training else 1
    return options.device_iterations * options.replication_factor * k


def split_iterations(args: tuple, options, training: bool) -> tuple:
    """Each tensor argument checked against the combined batch and, with device iterations,
    reshaped to ``[n, rows / n, ...]``."""
    n = options.device_iterations
    whole = combined_batch(options, training)
    out = []
    for i, x in enumerate(args):
        if not isinstance(x, torch.Tensor):
            out.append(x)
            continue
        _check_rows(i, x, options, training, whole)
        out.append(x.reshape(n, x.shape[0] // n, *x.shape[1:]) if n > 1 else x)
    return tuple(out)


def _check_rows(i: int, x: torch.Tensor, options, training: bool, whole: int) -> None:
    if whole == 1:
        return
    rows = x.shape[0] if x.dim() else 0
    if rows % whole == 0 and rows > 0:
        return
    terms = (
        f"deviceIterations({options.device_iterations}) * "
        f"replicationFactor({options.replication_factor})"
    )
    if training:
        terms += f" * gradientAccumulation({options.Training.gradient_accumulation})"
    raise Error(
        f"Invalid batch dimension: input {i} has shape {tuple(x.shape)}; its batch dimension "
        f"({rows}) must be a multiple of {terms} = {whole}: PopTorch's inputs hold every "
        "device iteration's, replica's and micro-batch's samples, concatenated on dim 0."
    )


def select_outputs(out: Any, options, n: int) -> Any:
    """Each tensor of ``out`` (leading dimension: the ``n`` iterations) as the output mode
    returns it."""
    if n == 1:
        return out
    mode, period = options.output_mode, options.output_return_period
    return pytree.tree_map(lambda t: _select(t, mode, period, n), out)


def _select(t: Any, mode: OutputMode, period: int, n: int) -> Any:
    if not isinstance(t, torch.Tensor) or t.dim() == 0 or t.shape[0] != n:
        return t
    if mode == OutputMode.Final:
        return t[-1]
    if mode == OutputMode.Sum:
        return t.sum(0)
    if mode == OutputMode.EveryN:
        t = t[period - 1 :: period]
    return t.reshape(-1, *t.shape[2:]) if t.dim() > 1 else t
