"""Host-side helpers popxl exposes as `popxl.utils`."""

from __future__ import annotations

from typing import List, Sequence

import numpy as np

from .tensor import to_numpy

__all__ = ["to_numpy", "downcast_np_dtypes", "table_to_string"]


def downcast_np_dtypes(arr: np.ndarray) -> np.ndarray:
    """int64 -> int32, uint64 -> uint32, float64 -> float32; other dtypes unchanged."""
    return to_numpy(arr, downcast=True)


def table_to_string(rows: Sequence[Sequence[object]], sep: str = " | ") -> str:
    """Rows as an aligned text table (the first row is the header)."""
    cells: List[List[str]] = [[str(c) for c in row] for row in rows]
    if not cells:
        return ""
    widths = [max(len(r[i]) for r in cells if i < len(r)) for i in range(max(map(len, cells)))]
    lines = [sep.join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)
