"""The host allocator keeps the memory a step frees, for the next step to reuse.

A simulated step allocates its temporaries afresh (torch tensors of the op kernels) and frees
them when they die. glibc's malloc serves large blocks with ``mmap`` and gives freed memory at
the top of its heap back to the OS (``trim``), so each step faulted the same pages in again,
zero-filled by the kernel: the mixed_precision tutorial's half step (a 41772x100 linear, its
AdamW state) took 16,000 page faults, 114 ms where 85 ms was its arithmetic, and eager
PyTorch's float32 step 8,000 (85 against 77 ms; tools: ``resource.getrusage``, thread CPU time,
2026-12-07, loaded 2-core Xeon). Raising the mmap threshold to glibc's most (32 MiB) and the
trim threshold to 256 MiB keeps blocks under 32 MiB in the heap once freed; a process holds
at most 256 MiB it does not use. Applied once per process, when the first Session compiles
(never on import), and not where the user's environment sets glibc's own ``MALLOC_*``
variables (their settings win) or the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "keep_freed_memory"]

MMAP_THRESHOLD = 32 << 20  # glibc's largest (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit)
TRIM_THRESHOLD = 256 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
_done: list[bool] = []


def _glibc():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
    except (OSError, TypeError):
        return None
    # glibc only: another C library's mallopt numbers mean other things
    return libc if hasattr(libc, "gnu_get_libc_version") else None


def keep_freed_memory() -> bool:
    """Set glibc's thresholds (module docstring) once per process; True when set."""
    if not _done:
        libc = None if any(k in os.environ for k in _ENV) else _glibc()
        _done.append(libc is not None and _keep_freed(libc))
    return _done[0]


def _keep_freed(libc) -> bool:
    mmap = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    return bool(mmap) and bool(libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
