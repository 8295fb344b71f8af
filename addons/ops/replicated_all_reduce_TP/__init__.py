"""Tensor-parallel all-reduces: a package, as popxl.addons' (its tests import
``popxl_addons.ops.replicated_all_reduce_TP.replicated_all_reduce_TP``); the op is in that
module."""

from .replicated_all_reduce_TP import (
    TP_ALL_REDUCE,
    replicated_all_reduce,
    replicated_all_reduce_identical_grad_inputs,
    replicated_all_reduce_identical_inputs,
)

__all__ = [
    "replicated_all_reduce",
    "replicated_all_reduce_identical_inputs",
    "replicated_all_reduce_identical_grad_inputs",
    "TP_ALL_REDUCE",
]
