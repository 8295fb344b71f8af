"""Bytes and seconds as people read them, for the report, its diff and the OOM messages.

A module of its own, below `report`, so that what `report` imports (`report_diff`, `oom`)
can format numbers without importing `report` back.
"""

from __future__ import annotations

__all__ = ["fmt_bytes", "fmt_seconds"]


def fmt_bytes(n: float) -> str:
    """Bytes in binary units: ``512 B``, ``624 KiB``, ``2.45 MiB``, ``1.17 GiB``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n // size:.0f} {unit}" if n % size == 0 else f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def fmt_seconds(s: float) -> str:
    """Seconds with a unit: ``3.4 ms``, ``12.0 us``."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale:
            return f"{s / scale:.1f} {unit}"
    return f"{s / 1e-9:.1f} ns"
