"""`CallPlan`: an executor call on inputs like the last full call's, without its per-call work.

A call of `PoplarExecutor` on the full path binds its arguments to forward's signature,
flattens them, checks each tensor against the compiled inputs (PopTorch's errors), detaches
those that require grad (PopTorch's warning), splits them by device iteration and, after the
step, narrows 64-bit outputs. After a full call whose arguments are positional tensors (of
type `torch.Tensor` exactly, none requiring grad, no custom argument parser for them, no
synthetic data) the executor keeps a `CallPlan`. A later call with no keyword arguments,
whose arguments are such tensors with the same dtypes and shapes (compared as torch's own
objects), on the same popxl_fx model and program, gives each of those steps what it gave
the planned call: binding and flattening depend only on the argument count, the checks and
the splits only on dtypes, shapes and the executor's options (frozen), the output dtypes only
on the program. So the call is one tuple comparison. Anything else takes the full path, which
checks, recompiles or raises exactly as PopTorch does, and plans again.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from . import batching
from .args import parser_for
from .dtypes import narrows

__all__ = ["CallPlan"]

_FACTS = operator.attrgetter("__class__", "requires_grad", "dtype", "shape")


def _key(args: tuple) -> tuple | None:
    """Each argument's dtype and shape (None: one is not a plain tensor, or requires grad)."""
    key = []
    for a in args:
        if type(a) is not torch.Tensor or a.requires_grad:
            return None
        key.append((a.dtype, a.shape))
    return tuple(key)


class CallPlan:
    """What a full call established, for the calls that repeat it."""

    def __init__(self, impl, key: tuple, reshapes: bool, narrow: bool, outputs=None) -> None:
        self.impl, self.program, self.key = impl, impl._active, key
        self._facts = tuple((torch.Tensor, False, *k) for k in key)  # `_FACTS` of the args
        self._reshapes = reshapes  # device iterations or PopART's row order: rows move
        self.narrow = narrow  # the outputs hold 64-bit tensors (`ipu_outputs`)
        # the training call's outputs from the trainer's ``last``, for this program
        # (`TrainingOutputs._planned_outputs`); None: the executor's full selection
        self.outputs = outputs
        # a training call needs nothing but the step and that getter (`PoplarExecutor._repeat`)
        self.repeats = outputs is not None and not reshapes and not narrow

    @classmethod
    def after(cls, executor, args: tuple, kwargs: dict, out: Any) -> CallPlan | None:
        """The plan of a full call of ``executor`` (``out``: its outputs before narrowing),
        or None where a later call cannot skip the full path's work."""
        opts, impl = executor.options, executor._impl
        key = None if kwargs or opts.enable_synthetic_data else _key(args)
        if key is None or impl is None or impl._active is None:
            return None
        if any(parser_for(a) is not None for a in args):
            return None
        reshapes = opts.device_iterations > 1 or (
            executor._training
            and opts.Training.gradient_accumulation > 1
            and opts.replication_factor > 1
        )
        outputs = executor._planned_outputs(impl)
        if not executor._wrapped.custom.plain_only():  # rebuilt around custom types per call
            outputs = None
        return cls(impl, key, reshapes, narrows(out), outputs)

    def holds(self, impl, args: tuple, kwargs: dict) -> bool:
        """``args`` are inputs like the planned call's, for the same model and program."""
        if kwargs or impl is not self.impl or impl._active is not self.program:
            return False
        try:  # `_key` as one comparison: each argument's class first, then its facts
            return tuple(map(_FACTS, args)) == self._facts
        except AttributeError:  # an argument that is no tensor
            return False

    def inputs(self, executor, args: tuple) -> tuple:
        """The tensors popxl_fx takes for ``args`` (as `PoplarExecutor._flat_inputs` gives
        them; its checks passed for these dtypes and shapes)."""
        if not self._reshapes:
            return args
        opts, training = executor.options, executor._training
        args = batching.split_iterations(args, opts, training)
        return batching.replica_major(args, opts, training)
