"""Host-side random seeds for the ``seed_tensor`` inputs of the random ops and dropout.

A seed is a uint32 array of shape (2,): the high and low words of one uint64 value.
"""

from __future__ import annotations

from typing import Tuple

import numpy as np

__all__ = ["create_seeds", "two_uint32_to_uint64", "uint64_to_two_uint32", "MAX_UINT64"]

MAX_UINT64 = 2**64 - 1
_WORD = 0xFFFFFFFF


def uint64_to_two_uint32(num: int) -> Tuple[int, int]:
    """Split a uint64 value into ``(high word, low word)``, as PopXL does.

    >>> uint64_to_two_uint32(2**32 + 7)
    (1, 7)
    """
    num = int(num)
    if not 0 <= num <= MAX_UINT64:
        raise ValueError(f"uint64_to_two_uint32: {num} is not in the uint64 range [0, 2**64).")
    return num >> 32, num & _WORD


def two_uint32_to_uint64(a: int, b: int) -> int:
    """The uint64 value whose high and low words are ``a`` and ``b`` (inverse of the above).

    >>> two_uint32_to_uint64(*uint64_to_two_uint32(12345678901234))
    12345678901234
    """
    hi, lo = int(a), int(b)
    if not (0 <= hi <= _WORD and 0 <= lo <= _WORD):
        raise ValueError(f"two_uint32_to_uint64: words {hi}, {lo} are not uint32 values.")
    return (hi << 32) | lo


def create_seeds(
    seed: int,
    offset: int = 0,
    batches_per_step: int = 1,
    gradient_accumulation_factor: int = 1,
    replicas: int = 1,
) -> np.ndarray:
    """Seeds for every (batch, accumulation step, replica), as uint32 words.

    ``np.random.default_rng(seed + offset)`` draws one uint64 per entry; each becomes two
    uint32 words. The result has shape ``[bps, gas, replicas, 2]`` with size-1 axes
    squeezed, so a single seed has shape (2,).

    >>> create_seeds(42).shape, create_seeds(42, replicas=4).shape
    ((2,), (4, 2))
    """
    counts = {
        "batches_per_step": batches_per_step,
        "gradient_accumulation_factor": gradient_accumulation_factor,
        "replicas": replicas,
    }
    for name, value in counts.items():
        if int(value) < 1:
            raise ValueError(f"create_seeds: {name} must be >= 1, got {value}.")
    rng = np.random.default_rng(int(seed) + int(offset))
    n = int(batches_per_step) * int(gradient_accumulation_factor) * int(replicas)
    values = rng.integers(0, 2**64, size=n, dtype=np.uint64, endpoint=False)
    words = np.array([uint64_to_two_uint32(int(v)) for v in values], np.uint32).reshape(n, 2)
    shape = (int(batches_per_step), int(gradient_accumulation_factor), int(replicas), 2)
    return np.squeeze(words.reshape(shape))
