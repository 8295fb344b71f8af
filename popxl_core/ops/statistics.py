"""Whole-tensor statistics: LambSquare (the squared L2 norm LAMB needs) and Histogram.

Neither has a gradient (PopART declares none): they feed optimiser steps and monitoring.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .. import dtypes
from ..tensor import Tensor
from ._utils import rand, spec
from .registry import Cost, OpDef, Sample, create_op, register

__all__ = ["histogram", "lamb_square"]


# LambSquare ------------------------------------------------------------------------------
def _lamb_infer(ins):
    (x,) = ins
    if not x.dtype.is_floating_point:
        raise TypeError(f"lamb_square needs a floating point tensor, got {x.dtype.name}.")
    return [spec((), dtypes.float32)]


def _lamb_kernel(x):
    # a float32 sum of float32 squares, for float16 input too (LAMB's norms are float32)
    x = x.float()
    return torch.sum(x * x)


def _lamb_cost(ins, outs, attrs) -> Cost:
    return Cost(2 * ins[0].nelms, ins[0].nbytes + 4)


def _lamb_samples():
    return [
        Sample([rand(3, 5)], lamb_square, lambda x: torch.sum(x * x), grad=False),
        Sample(
            [rand(4, 6).astype(np.float16)],
            lamb_square,
            lambda x: torch.sum(x.float() * x.float()),
            grad=False,
            name="float16",
        ),
    ]


LAMB_SQUARE = register(
    OpDef(
        "LambSquare",
        _lamb_infer,
        _lamb_kernel,
        cost=_lamb_cost,
        samples=_lamb_samples,
        fp16_in_fp32=False,
    )
)


def lamb_square(t: Tensor) -> Tensor:
    """The sum of the squares of every element of ``t``, as a float32 scalar (the squared
    L2 norm the LAMB optimiser divides by; https://arxiv.org/abs/1904.00962)."""
    return create_op(LAMB_SQUARE, [t], {})[0]


# Histogram -------------------------------------------------------------------------------
def _hist_infer(ins, levels, absolute_of_input):
    (x,) = ins
    if not x.dtype.is_floating_point:
        raise TypeError(f"histogram needs a floating point tensor, got {x.dtype.name}.")
    return [spec((len(levels) + 1,), dtypes.uint32)]


def _hist_kernel(x, levels, absolute_of_input):
    x = x.float().abs() if absolute_of_input else x.float()
    bins = torch.bucketize(x.flatten(), torch.tensor(levels, dtype=torch.float32), right=True)
    return torch.bincount(bins, minlength=len(levels) + 1).to(torch.uint32)


def _hist_cost(ins, outs, attrs) -> Cost:
    return Cost(ins[0].nelms * max(1, len(attrs["levels"])), ins[0].nbytes + outs[0].nbytes)


def _hist_reference(levels, absolute):
    def ref(x):
        v = x.abs() if absolute else x
        # bin 0: v < levels[0]; bin i: levels[i-1] <= v < levels[i]; last: v >= levels[-1]
        edges = [-float("inf"), *levels, float("inf")]
        counts = [int(((v >= lo) & (v < hi)).sum()) for lo, hi in zip(edges, edges[1:])]
        return torch.tensor(counts, dtype=torch.uint32)

    return ref


def _hist_samples():
    x = np.array([[-2.0, -0.5, 0.0, 0.5], [1.0, 1.5, 3.0, -1.0]], np.float32)
    levels = [-1.0, 0.5, 1.0]
    return [
        Sample(
            [x],
            lambda t: histogram(t, levels, False),
            _hist_reference(levels, False),
            grad=False,
        ),
        Sample(
            [rand(5, 7, low=-3, high=3)],
            lambda t: histogram(t, [0.5, 1.0, 2.0], True),
            _hist_reference([0.5, 1.0, 2.0], True),
            grad=False,
            name="absolute",
        ),
    ]


HISTOGRAM = register(
    OpDef(
        "Histogram",
        _hist_infer,
        _hist_kernel,
        cost=_hist_cost,
        samples=_hist_samples,
        fp16_in_fp32=False,
    )
)


def histogram(t: Tensor, levels: Sequence[float], absolute_of_input: bool) -> Tensor:
    """How many elements of ``t`` (or of ``|t|`` with ``absolute_of_input``) fall in each bin
    of the sorted ``levels``: a uint32 tensor of ``len(levels) + 1`` counts, bin 0 below
    ``levels[0]``, bin ``i`` in ``[levels[i-1], levels[i])``, the last at or above
    ``levels[-1]`` (poplar's popops::histogram)."""
    levels = [float(v) for v in levels]
    if not levels or any(b <= a for a, b in zip(levels, levels[1:])):
        raise ValueError(f"histogram: levels must be a non-empty increasing list, got {levels}.")
    attrs = {"levels": tuple(levels), "absolute_of_input": bool(absolute_of_input)}
    return create_op(HISTOGRAM, [t], attrs)[0]
