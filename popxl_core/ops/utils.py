"""`popxl.ops.utils`: argument checks shared by op functions."""

from __future__ import annotations

from typing import Optional

from .registry import check_in_graph, check_tensor_ipu_and_tile_set

__all__ = ["check_in_graph", "check_tensor_ipu_and_tile_set", "convert_optional_float"]


def convert_optional_float(v: Optional[float]) -> Optional[float]:
    """``None`` stays ``None`` (the op's default); anything else becomes a python float."""
    return None if v is None else float(v)
