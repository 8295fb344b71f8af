"""Data parallelism for popxl_fx programs: the host side of ``Options(replication_factor=R)``.

Every input is split along its first (batch) dimension into R equal shares, in batch order:
replica r gets rows ``[r * B/R, (r + 1) * B/R)``, which is PopXL's host layout for a
replicated stream (``[R, B/R, ...]``). One replica's program is traced and built on the first
share, so the program has the shapes one replica sees. What comes back per replica is put
together again: a loss as the mean over the replicas (for a loss that is a mean over the batch,
the whole batch's mean loss, as eager computes it, up to float32 round-off), forward outputs
concatenated back into batch order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from .options import Options

__all__ = [
    "broadcast_feeds",
    "check_batch",
    "concat_replicas",
    "mean_over_replicas",
    "replica_examples",
    "split_feeds",
]


def _divisor_text(options: Options, training: bool) -> str:
    if not training:
        return f"replication_factor={options.replication_factor}"
    return (
        f"gradient_accumulation={options.gradient_accumulation} x batch_serialisation="
        f"{options.batch_serialisation} x replication_factor={options.replication_factor}"
    )


def check_batch(inputs: Sequence[object], options: Options, training: bool = True) -> None:
    """Every input has a batch dimension that divides by what the options split it into
    (`Options.batch_divisor` for training, ``replication_factor`` for inference)."""
    divisor = options.batch_divisor if training else options.replication_factor
    if divisor == 1:
        return
    sizes = set()
    for i, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor) or x.dim() == 0:
            raise ValueError(
                f"popxl_fx: input {i} has no batch dimension to split over the options' "
                f"{_divisor_text(options, training)}; pass tensors whose first dimension is "
                "the batch (or leave those options at 1)."
            )
        sizes.add(x.shape[0])
    if len(sizes) > 1:
        raise ValueError(
            f"popxl_fx: the inputs have different batch sizes {sorted(sizes)} (dim 0); "
            f"{_divisor_text(options, training)} splits every input along dim 0, so give "
            "them all the same batch size."
        )
    (batch,) = sizes
    if batch % divisor:
        lower, higher = (batch // divisor) * divisor, (batch // divisor + 1) * divisor
        fix = f"{higher}" + (f" or {lower}" if lower else "")
        raise ValueError(
            f"popxl_fx: the batch size {batch} does not divide by {divisor} = "
            f"{_divisor_text(options, training)}; use a batch of {fix} (a multiple of "
            f"{divisor}) or change those options."
        )


def replica_examples(inputs: Sequence[torch.Tensor], replicas: int) -> tuple:
    """What one replica sees: the first ``B / replicas`` rows of every input."""
    if replicas == 1:
        return tuple(inputs)
    return tuple(x[: x.shape[0] // replicas] for x in inputs)


def split_feeds(feeds: Mapping[object, np.ndarray], replicas: int) -> dict:
    """Host arrays ``[B, ...]`` as PopXL's replicated layout ``[R, B/R, ...]``."""
    if replicas == 1:
        return dict(feeds)
    return {s: a.reshape(replicas, a.shape[0] // replicas, *a.shape[1:]) for s, a in feeds.items()}


def broadcast_feeds(feeds: Mapping[object, np.ndarray], replicas: int) -> dict:
    """Host arrays every replica gets whole (the optimizer's hyper-parameters), as ``[R, ...]``."""
    if replicas == 1:
        return dict(feeds)
    return {s: np.broadcast_to(a, (replicas, *np.shape(a))) for s, a in feeds.items()}


def mean_over_replicas(values: np.ndarray, replicas: int) -> torch.Tensor:
    """A per-replica scalar stream's ``[R]`` values as their mean (float32, as torch's)."""
    if replicas == 1:
        return torch.from_numpy(values.copy())
    return torch.from_numpy(values.copy()).mean(0)


def concat_replicas(values: np.ndarray, replicas: int) -> torch.Tensor:
    """A per-replica output ``[R, b, ...]`` as one batch ``[R * b, ...]`` in batch order."""
    t = torch.from_numpy(values.copy())
    if replicas == 1:
        return t
    if t.dim() < 2:
        raise ValueError(
            "popxl_fx: with replication_factor > 1 every output must keep the batch dimension "
            f"to be put back together; an output has shape {tuple(t.shape[1:])} per replica."
        )
    return t.reshape(-1, *t.shape[2:])
