"""Pointwise kernels whose result for an element does not depend on where it sits in a tensor.

torch's CPU elementwise loops (ATen ``vectorized_loop``) compute a contiguous run of elements
in SIMD blocks of two vectors and the last ``n mod (2 * vector width)`` elements with the
scalar code. For the transcendental ops (tanh-gelu, sigmoid, exp, ...) the SIMD and the scalar
formulas round differently, so the same value gives a different last bit depending on how many
elements the tensor has and on the CPU's vector width (AVX512: blocks of 32 floats, AVX2: 16).
Batch serialisation and replication compute a row in a tensor of fewer rows than the whole
batch: on AVX512 a (3, 16) gelu has 16 elements in the scalar tail where a (12, 16) gelu has
none (Graphcore's test_batch_serialisation_sharded_activations, 2.9e-6 apart).

Under ``Ir.numerics == "ipu"`` a `OpDef.pointwise` op runs on its operands flattened and padded
to a multiple of `BLOCK` elements, so every element goes through the SIMD code whatever the
tensor's size; with several threads the padding also makes each thread's share a multiple of
`BLOCK` (ATen splits a loop of more than `GRAIN` elements evenly between threads). Operands
whose size is already a multiple of `BLOCK` (every batch of 8 rows of a 512-wide layer) run
unchanged. Broadcast operands (a bias row) keep the row structure, in which every row is
computed by the same code whatever the number of rows, so they run unchanged too.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch
import torch.nn.functional as F

__all__ = ["BLOCK", "GRAIN", "padded_length", "position_invariant"]

# Two SIMD vectors of the widest float type torch vectorises (AVX512: 2 x 16 float32 = 32;
# 2 x 32 for float16/bfloat16), doubled so a wider future vector still divides it.
BLOCK = 64
# at::internal::GRAIN_SIZE: ATen runs an elementwise loop on one thread below this many elements.
GRAIN = 32768


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def padded_length(n: int, threads: int) -> int:
    """The smallest length >= n, a multiple of `BLOCK`, whose per-thread shares (ATen's
    ``parallel_for``: ceil(n / t) elements each, t = min(threads, ceil(n / GRAIN))) are
    multiples of `BLOCK` too."""
    m = _ceil_div(n, BLOCK) * BLOCK
    while m > GRAIN and threads > 1:
        t = min(threads, _ceil_div(m, GRAIN))
        if t <= 1 or _ceil_div(m, t) % BLOCK == 0:
            break
        m += BLOCK
    return m


def _aligned(x: torch.Tensor, threads: int) -> bool:
    return x.is_contiguous() and padded_length(x.numel(), threads) == x.numel()


def _pad(x: torch.Tensor, m: int) -> torch.Tensor:
    flat = x.reshape(-1)
    return F.pad(flat, (0, m - flat.numel())) if m > flat.numel() else flat.contiguous()


def position_invariant(kernel: Callable, inplace: bool) -> Callable:
    """``kernel`` (pointwise, operands of one shape or single elements) computed on operands
    padded to `padded_length`, its outputs cut back; an in-place kernel's result is copied
    into its first operand."""

    @functools.wraps(kernel)
    def run(*args, **attrs):
        tensors = [a for a in args if isinstance(a, torch.Tensor) and a.numel() > 1]
        if not tensors:
            return kernel(*args, **attrs)
        shape = tensors[0].shape
        threads = torch.get_num_threads()
        if any(t.shape != shape for t in tensors) or all(_aligned(t, threads) for t in tensors):
            return kernel(*args, **attrs)
        n = tensors[0].numel()
        m = padded_length(n, threads)
        padded = [_pad(a, m) if isinstance(a, torch.Tensor) and a.numel() > 1 else a for a in args]
        res = kernel(*padded, **attrs)
        outs = res if isinstance(res, tuple) else (res,)
        cut = tuple(
            o[:n].view(shape) if isinstance(o, torch.Tensor) and o.numel() == m else o for o in outs
        )
        if inplace:
            return args[0].copy_(cut[0])
        return cut if isinstance(res, tuple) else cut[0]

    return run
