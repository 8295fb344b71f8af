"""Shared pytest set-up: give memory back between the large-model tests.

The torchvision models of the slow tier hold several GB each (vgg11_bn with AdamW: the model,
its eager twin, both optimizer states and the simulator's copies). What a test frees can stay
in reference cycles until the collector runs, and glibc keeps freed heap pages mapped; run one
after another in one process, the tests then add up past a 24 GiB machine. After each slow test
the cycles are collected and the free heap is returned to the system (``malloc_trim``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc

import pytest

_LIBC = ctypes.util.find_library("c")
_TRIM = getattr(ctypes.CDLL(_LIBC), "malloc_trim", None) if _LIBC else None


@pytest.fixture(autouse=True)
def _release_memory_after_slow_tests(request):
    yield
    if request.node.get_closest_marker("slow") is not None:
        gc.collect()
        if _TRIM is not None:
            _TRIM(0)
