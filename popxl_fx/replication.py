"""Data parallelism for popxl_fx programs (``Options(replication_factor=R)``): the batch split
on the host, the pipeline's gradient reduction (`reduce_gradients`), the results put back
together.

In a torch.distributed job (``torchrun``; `popxl_core.distributed`) each process runs R/P of
the replicas and passes its own share of the global batch (a ``DistributedSampler``-style split
of the data): that share is split over its R/P replicas (`split_replicas`), and the loss and
outputs that come back are every replica's, as in one process.

Every input is split along its first (batch) dimension into R equal shares, in batch order:
replica r gets rows ``[r * B/R, (r + 1) * B/R)``, which is PopXL's host layout for a
replicated stream (``[R, B/R, ...]``). One replica's program is traced and built on the first
share, so the program has the shapes one replica sees. What comes back per replica is put
together again: a loss as the mean over the replicas (for a loss that is a mean over the batch,
the whole batch's mean loss, as eager computes it, up to float32 round-off), forward outputs
concatenated back into batch order.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from popxl_core.distributed import local_replica_count

from .optim_replicated import Replication
from .options import Options

__all__ = [
    "ReplicaFeeds",
    "check_batch_split",
    "from_replicas",
    "reduce_each",
    "reduce_gradients",
    "replica_examples",
    "replication_of",
    "split_replicas",
    "unreplicated",
]


def split_replicas(options: Options) -> int:
    """The replicas this process's inputs are split over: ``replication_factor``, or in a
    torch.distributed job this process's share of them (`popxl_core.distributed`)."""
    return local_replica_count(options.replication_factor)


def _divisor_text(options: Options, training: bool) -> str:
    r, local = options.replication_factor, split_replicas(options)
    replicas = f"replication_factor={r}" if r == local else f"{local} of the {r} replicas here"
    if not training:
        return replicas
    return (
        f"gradient_accumulation={options.gradient_accumulation} x batch_serialisation="
        f"{options.batch_serialisation} x {replicas}"
    )


def check_batch_split(inputs: Sequence[object], options: Options, training: bool = True) -> None:
    """Every input has a batch dimension that divides by what the options split it into
    (`Options.batch_divisor` for training, ``replication_factor`` for inference)."""
    divisor = options.batch_divisor if training else options.replication_factor
    divisor = divisor // options.replication_factor * split_replicas(options)
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


def replication_of(options: Options) -> Replication:
    """The optimizer update's replication for ``options``."""
    return Replication(options.replication_factor, options.replicated_tensor_sharding)


def reduce_each(options: Options, grads: Mapping[str, Any]) -> dict:
    """Each gradient reduced over the replicas (`Replication.reduce_gradient`: mean
    all-reduced, or with RTS reduce-scattered), in order: every shape of step reduces so
    (the phased step per phase)."""
    reduce = replication_of(options).reduce_gradient
    return {n: reduce(g) for n, g in grads.items()}


def reduce_gradients(build, grads: Mapping[str, Any], record: bool = True) -> dict:
    """`pipeline.reduce_gradients` for a `pipeline.Build`: the gradients reduced over the
    replicas (`Replication.reduce_gradient`), and (``record``) the "replication" stage."""
    opts = build.options
    if opts.replication_factor == 1:
        return dict(grads)
    reduced = reduce_each(opts, grads)
    if record:
        build.record("replication", _replication_detail(opts))
    return reduced


def _replication_detail(opts: Options) -> str:
    r, how = (
        opts.replication_factor,
        "gradients mean all-reduced, every replica applies the same update",
    )
    if opts.replicated_tensor_sharding:
        how = (
            "gradients reduce-scattered (mean), optimizer state sharded ceil(n/R) per replica, "
            "updated weights all-gathered"
        )
    return f"{r} replicas, each on 1/{r} of the batch; {how}"


class ReplicaFeeds:
    """Lays out host arrays that every replica gets whole (the optimizer's hyper-parameters) as
    ``[R, ...]`` (``[n, R, ...]`` when they have a leading ``iterations`` dimension n > 1).

    One per program: an SGD step feeds the same hyper-parameter arrays every step
    (popxl_fx.optim keeps them until lr changes), so each array's view is kept while that
    array is fed. The view shares the array's memory, so it is right even after an in-place
    write; the entry holds the array, so its id is not reused while it is kept.
    """

    def __init__(self, replicas: int, iterations: int = 1) -> None:
        self.replicas = replicas
        self.lead = 1 if iterations > 1 else 0
        self._views: dict[int, tuple] = {}  # id(array) -> (array, shape, dtype, view)

    def __call__(self, feeds: Mapping[object, np.ndarray]) -> dict:
        if self.replicas == 1:
            return dict(feeds)
        views = {s: self._view(a) for s, a in feeds.items()}
        if len(self._views) > 4 * len(feeds):  # arrays no longer fed (Adam: new each step)
            kept = {id(a) for a in feeds.values()}
            self._views = {k: v for k, v in self._views.items() if k in kept}
        return views

    def _view(self, a) -> np.ndarray:
        hit = self._views.get(id(a))
        if hit is not None and hit[0] is a and hit[1:3] == (a.shape, a.dtype):
            return hit[3]
        view = _broadcast(np.asarray(a), self.replicas, self.lead)
        if isinstance(a, np.ndarray):
            self._views[id(a)] = (a, a.shape, a.dtype, view)
        return view


def _broadcast(a: np.ndarray, replicas: int, lead: int) -> np.ndarray:
    """A read-only view (stride 0 along the replicas: `uniform` sees them equal at once).
    Made by the ndarray constructor over ``a``'s memory where ``a`` is contiguous (what
    ``np.broadcast_to`` makes, without its Python: 8 us a feed in a replicated step, 5 feeds
    a seed-MLP SGD step)."""
    shape = (*a.shape[:lead], replicas, *a.shape[lead:])
    if not a.flags.c_contiguous:
        return np.broadcast_to(a[(slice(None),) * lead + (None,)], shape)
    strides = (*a.strides[:lead], 0, *a.strides[lead:])
    view = np.ndarray(shape, a.dtype, a, 0, strides)
    view.flags.writeable = False
    return view


def unreplicated(
    outputs: Mapping[str, object], values: Mapping[Any, np.ndarray], inputs, options: Options
) -> dict[str, torch.Tensor]:
    """The run's ``values`` of the named d2h streams ``outputs`` as torch tensors, put back
    together over the replicas (`from_replicas`) for the step's ``inputs``."""
    n, r = options.device_iterations, options.replication_factor
    if r == 1:
        return {k: torch.from_numpy(values[s].copy()) for k, s in outputs.items()}
    if all(values[s].ndim <= (2 if n > 1 else 1) for s in outputs.values()):
        batch = 0  # scalars alone (a loss): no rows to put back in order
    else:  # one replica's rows
        batch = inputs[0].shape[1 if n > 1 else 0] // split_replicas(options)
    return {k: from_replicas(k, values[s], r, batch, n) for k, s in outputs.items()}


def from_replicas(
    name: str, values: np.ndarray, replicas: int, batch: int, iterations: int = 1
) -> torch.Tensor:
    """A device-to-host stream's per-replica ``values`` (``[R, ...]``, or ``[n, R, ...]`` with
    ``iterations`` n > 1) as one torch tensor: the loss and other scalars as the mean over
    replicas, gradients ("grad.*") as the mean all-reduce computes it (added in replica order,
    divided by R), forward outputs concatenated back in batch order (their dim 0 a multiple of
    ``batch``, the rows of one replica)."""
    axis = 1 if iterations > 1 else 0
    scalar = values.ndim == axis + 1 and not name.startswith("grad.")
    if replicas > 1 and scalar and values.flags.writeable:
        # scalars (a loss): their mean is a new tensor, so no copy of the run's buffer first
        return torch.from_numpy(values).mean(axis)
    t = torch.from_numpy(values.copy())
    if replicas == 1:
        return t
    if name.startswith("grad."):
        return functools.reduce(torch.add, t.unbind(axis)) / replicas
    per_replica = t.shape[axis + 1 :]
    if not per_replica:
        return t.mean(axis)
    if per_replica[0] % batch:
        raise ValueError(
            f"popxl_fx: output {name!r} has shape {tuple(per_replica)} per replica: its first "
            f"dimension is not a multiple of the replica's batch ({batch}), so it cannot be "
            "put back together in batch order; return per-sample outputs (batch first) or a "
            "scalar (averaged over replicas), or use replication_factor=1."
        )
    return t.reshape(*t.shape[:axis], -1, *per_replica[1:])
