"""PopTorch's combined batch in, PopTorch's output modes out.

A PopTorch call takes every device iteration's inputs concatenated on dim 0:
``deviceIterations x replicationFactor x gradientAccumulation x micro-batch`` rows. popxl_fx
takes device iterations as a leading dimension (``[n, rows/n, ...]``) and splits the rest
over replicas and micro-batches itself. Outputs come back per iteration (``[n, ...]``) and
are returned as the output mode says: All (concatenated again), Final (the last iteration),
EveryN (every N-th, concatenated) or Sum (added over iterations).

A training call with gradient accumulation or replication returns what PopART's anchors
hold: the rows are PopART's ``[n, k, R, rows]`` (`replica_major` hands popxl_fx each
replica's rows), and every micro-batch's outputs of every replica come back
(`device_order`), selected by the output mode over the ``n x k`` micro-batches
(`select_micro_batches`): one loss per replica, not their mean.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree

from .enums import OutputMode
from .errors import Error

__all__ = [
    "combined_batch",
    "device_order",
    "replica_major",
    "select_micro_batches",
    "select_outputs",
    "split_iterations",
]


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


def replica_major(args: tuple, options, training: bool) -> tuple:
    """Each tensor's rows from PopTorch's order to popxl_fx's, with both gradient accumulation
    and replication: within a device iteration PopTorch's rows are ``[k, R, m]`` (micro-batch,
    replica, sample: PopART's layout), popxl_fx's ``[R, k, m]`` (a replica's rows, cut into
    its micro-batches)."""
    k, r = options.Training.gradient_accumulation, options.replication_factor
    if not training or k == 1 or r == 1:
        return args
    dim = 1 if options.device_iterations > 1 else 0
    return tuple(_swap_rows(x, dim, k, r) if isinstance(x, torch.Tensor) else x for x in args)


def _swap_rows(x: torch.Tensor, dim: int, a: int, b: int) -> torch.Tensor:
    """``x``'s dim ``dim`` read as ``[a, b, m]``, returned as ``[b, a, m]`` (same shape)."""
    lead, rows, rest = x.shape[:dim], x.shape[dim], x.shape[dim + 1 :]
    grid = x.reshape(*lead, a, b, rows // (a * b), *rest).transpose(dim, dim + 1)
    return grid.reshape(x.shape)


def device_order(values, n: int, r: int, k: int, per_micro: bool) -> torch.Tensor:
    """One output as the device wrote it (``[n?][R?][k?] ...``: the leading dimensions only
    where above 1, ``k`` only ``per_micro``) as ``[n * k, R, ...]``: PopTorch's micro-batches
    in order, each with its replicas."""
    t = torch.from_numpy(values.copy())  # the run's buffers are the next run's
    if n == 1:
        t = t.unsqueeze(0)
    if r == 1:
        t = t.unsqueeze(1)
    if not per_micro:
        t = t.unsqueeze(2)
    t = t.transpose(1, 2)
    return t.reshape(n * t.shape[1], r, *t.shape[3:])


def select_micro_batches(t: torch.Tensor, mode: OutputMode, period: int) -> torch.Tensor:
    """``[micro-batches, R, ...]`` as PopTorch returns it: the micro-batches the output mode
    keeps (Final: the last; Sum: their sum; EveryN: every N-th; All), each with its replicas,
    concatenated on dim 0 (a scalar per micro-batch and replica becomes ``[count]``; one
    alone stays as it is)."""
    if mode == OutputMode.Final:
        t = t[-1:]
    elif mode == OutputMode.Sum:
        t = t.sum(0, keepdim=True)
    elif mode == OutputMode.EveryN:
        t = t[period - 1 :: period]
    count, shape = t.shape[0] * t.shape[1], t.shape[2:]
    if count == 1:
        return t.reshape(shape)
    if not shape:
        return t.reshape(count)
    return t.reshape(count * shape[0], *shape[1:])
