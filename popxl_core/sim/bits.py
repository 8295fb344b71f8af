"""Bit-for-bit equality of tensors: the check every "the same values computed another way"
path passes before it is used (replica stacking, replica folding and its reductions, uniform
sharing's check that replicas hold the same variables; batching.py).

A batched form of an op is checked one way wherever it is made: its result against the
fallback's (each replica's own call) on the same arguments, output by output
(`same_outputs`), the forms tried in order (`first_match`); a site remembers the outcome
per key (`Checked`)."""

from __future__ import annotations

from typing import Any, Callable, Dict, Hashable, Iterable, Optional, Sequence, Tuple

import torch

__all__ = ["Checked", "as_tuple", "first_match", "same_bits", "same_outputs"]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a`` and ``b`` have one dtype and shape and the same bytes (NaN payloads and -0.0
    as they are: value equality would take -0.0 for 0.0 and no NaN for itself)."""
    if a is b:
        return True
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(_bytes(a), _bytes(b))


# The bytes compared as integers of the dtype's width: the same bits, a quarter of the
# comparisons for float32 (torch.equal on the uint8 view was 1 % of the test suite's CPU).
_WORDS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bytes(t: torch.Tensor) -> torch.Tensor:
    flat = t.contiguous().reshape(-1)
    return flat.view(_WORDS.get(t.element_size(), torch.uint8))


def as_tuple(result: Any) -> tuple:
    """A kernel's result as a tuple of its outputs (one output: a 1-tuple)."""
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


Outputs = Sequence[Optional[torch.Tensor]]  # an op's result, None where not made


def same_outputs(got: Outputs, want: Outputs) -> bool:
    """Two results of one op, output by output, are the same bits (None, an output not made,
    only where the other is None too)."""
    if len(got) != len(want):
        return False
    return all(
        (a is None) == (b is None) and (a is None or same_bits(a, b)) for a, b in zip(got, want)
    )


def first_match(
    forms: Iterable[Callable],
    args: tuple,
    want: Outputs,
    outputs: Callable[[Any], Outputs] = as_tuple,
) -> Optional[Tuple[Callable, Any]]:
    """``(form, its result)``: the first of ``forms`` whose outputs on ``args`` (the result
    as ``outputs`` lists them) are ``want``'s bits, or None (the caller falls back to each
    replica's own call). A form that raises on these arguments (a shape its rule did not
    foresee) is passed over."""
    for form in forms:
        try:
            got = form(*args)
        except (RuntimeError, ValueError, IndexError):
            continue
        if same_outputs(outputs(got), want):
            return form, got
    return None


class Checked:
    """A batched site's forms, checked by `first_match` at the first call of a key (what may
    change the kernels torch picks: shapes, strides, threads) and the outcome remembered for
    that key: the one bit check of `batched_site.BatchedSite`, whenever its rows are made."""

    def __init__(
        self, forms: Iterable[Callable], outputs: Callable[[Any], Outputs] = as_tuple
    ) -> None:
        self.forms = tuple(forms)
        self.outputs = outputs  # a form's result -> its outputs, as the fallback's are given
        self.found: Dict[Hashable, Optional[Callable]] = {}  # key -> its form (None: fallback)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.found

    def form(self, key: Hashable) -> Optional[Callable]:
        """The form checked equal for ``key`` (None: the fallback, or not checked)."""
        return self.found.get(key)

    def check(self, key: Hashable, args: tuple, want: Outputs) -> Optional[Tuple[Callable, Any]]:
        """`first_match` on ``args`` against the fallback's outputs ``want``, remembered."""
        found = first_match(self.forms, args, want, self.outputs)
        self.found[key] = None if found is None else found[0]
        return found

    def clear(self) -> None:
        """Check again at every key's next call."""
        self.found.clear()
