"""What a training call of `PoplarExecutor` returns (a mixin): the model's outputs with the
loss in its place, per micro-batch and replica as PopTorch's output modes select them."""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

import popxl_fx

from . import batching

if TYPE_CHECKING:  # pragma: no cover
    from .options import Options
    from .wrapper import Wrapped

__all__ = ["TrainingOutputs", "fetches_outputs"]


class TrainingOutputs:
    """Mixin of `PoplarExecutor`: the outputs of its training calls."""

    # PoplarExecutor's state these methods use (made in its __init__), for the type checker
    _training: bool
    _options: Options
    _wrapped: Wrapped

    def _training_outputs(self, impl, loss: torch.Tensor) -> Any:
        """The model's outputs from a training call (the loss in its place), as the output
        mode returns them."""
        fx, prog = impl.options, impl._active
        if not fetches_outputs(fx):
            loss = self._unscaled(loss.as_subclass(torch.Tensor))
            return batching.select_outputs(loss, self._options, fx.device_iterations)
        n = prog.lowered.fxm.out_spec.num_leaves
        if fx.gradient_accumulation > 1 or fx.replication_factor > 1:
            leaves = self._per_micro_batch(impl, n)
        else:  # leaf 0, the training loss, is not among the model's outputs returned
            leaves = [None, *map(impl.last.__getitem__, _output_names(n))]
            leaves = batching.select_outputs(leaves, self._options, fx.device_iterations)
        return prog.lowered.fxm.unflatten(leaves)[1]

    def _planned_outputs(self, impl) -> Callable[[dict], Any] | None:
        """What `_training_outputs` returns, as a function of the trainer's ``last`` made
        once per program (`call_plan`), where the model's outputs are one tensor or a plain
        tuple of them, each fetched once per step (no accumulation, replication or device
        iterations to select over); else None."""
        if not self._training:
            return None
        fx, fxm = impl.options, impl._active.lowered.fxm
        if not fetches_outputs(fx) or fxm._nones:
            return None
        if max(fx.gradient_accumulation, fx.replication_factor, fx.device_iterations) > 1:
            return None
        return _tail_getter(fxm.out_spec.child(1), _output_names(fxm.out_spec.num_leaves))

    def _per_micro_batch(self, impl, n: int) -> list[torch.Tensor]:
        """The outputs of every micro-batch of every replica, as PopTorch returns them: one
        value per replica (the loss: ``[R]``), per the output mode over the micro-batches."""
        fx = impl.options
        per_micro = fx.gradient_accumulation > 1
        names = [f"micro.{i}" for i in range(n)] if per_micro else ["loss"] + [
            f"output.{i}" for i in range(1, n)
        ]  # fmt: skip
        return self._per_replica([impl.per_replica[name] for name in names], fx, per_micro)

    def _per_replica(self, values: list, fx: popxl_fx.Options, per_micro: bool) -> list:
        """Each output as the device wrote it, as PopTorch returns it (`batching`); in a
        training call the first is the loss, each of its values unscaled first."""
        opts, k = self._options, fx.gradient_accumulation if per_micro else 1
        shape = (fx.device_iterations, fx.replication_factor, k, per_micro)
        ts = [batching.device_order(v, *shape) for v in values]
        if self._training:
            ts[0] = self._unscaled(ts[0])
        mode, period = opts.output_mode, opts.output_return_period
        return [batching.select_micro_batches(t, mode, period) for t in ts]

    def _unscaled(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss the model computed (Sum reduction scales it in the program)."""
        if self._wrapped.loss_factor != 1.0:
            return loss / self._wrapped.loss_factor
        return loss


def _tail_getter(spec, names: tuple[str, ...]) -> Callable[[dict], Any] | None:
    """The model's outputs (``spec``: their structure; ``names``: the trainer's names of its
    leaves) from the trainer's ``last``: a tensor, or a plain tuple of tensors."""
    if spec.is_leaf():
        return operator.itemgetter(names[0])
    if spec.type is not tuple or not all(c.is_leaf() for c in spec.children()):
        return None
    if len(names) == 1:  # itemgetter of one name gives the value, not a 1-tuple
        return lambda last: (last[names[0]],)
    return operator.itemgetter(*names)


@functools.lru_cache(maxsize=64)
def _output_names(n: int) -> tuple[str, ...]:
    """The trainer's names of the forward's outputs after the loss (made once per count)."""
    return tuple(f"output.{i}" for i in range(1, n))


def fetches_outputs(fx: popxl_fx.Options) -> bool:
    """The step's forward outputs can be fetched: per step, or per micro-batch of the
    accumulation loop (not from phased or batch-serialised steps)."""
    return fx.batch_serialisation == 1 and fx.phased_execution is False
