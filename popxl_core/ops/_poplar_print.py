"""The text Poplar's PrintTensor program writes (what PopTorch's ``ipu_print_tensor`` shows):
a tensor of two or more dimensions opens its bracket on the title's line, puts each
sub-tensor on a line of its own one space deeper and closes on a line of its own; a row's
values are joined by the separator alone and wrap past the line width, two spaces deeper."""

from __future__ import annotations

from typing import Any, Dict, List

import numpy as np

__all__ = ["poplar_text"]


def _value(v, opts: Dict[str, Any]) -> str:
    if not np.issubdtype(np.asarray(v).dtype, np.floating):
        return str(v.item() if hasattr(v, "item") else v)
    # the digits count significant figures in every format: Poplar prints 8 digits of
    # 1.49625659 as "1.4962566", fixed or scientific
    places = max(opts["digits"] - 1, 0)
    if opts["float_format"] == "scientific":
        return f"{float(v):.{places}e}"
    if opts["float_format"] == "fixed":
        return f"{float(v):.{places}f}"
    return f"{float(v):.{opts['digits']}g}"


def _cut(items: List[str], a: np.ndarray, opts: Dict[str, Any]) -> List[str]:
    """The first and last ``edgeitems`` of a summarised axis, with "..." between."""
    edge = opts["edgeitems"]
    if a.size <= opts["threshold"] or len(items) <= 2 * edge:
        return items
    return items[:edge] + ["..."] + items[-edge:]


def _row(a: np.ndarray, indent: int, opts: Dict[str, Any]) -> str:
    values = _cut([_value(v, opts) for v in a], a, opts)
    sep, line, lines = opts["separator"], " " * indent + opts["open_bracket"], []
    for i, text in enumerate(values):
        piece = text + (sep if i < len(values) - 1 else opts["close_bracket"])
        if i and len(line) + len(piece) > opts["linewidth"]:
            lines.append(line)
            line = " " * (indent + 2)
        line += piece
    return "\n".join(lines + [line])


def _block(a: np.ndarray, indent: int, opts: Dict[str, Any], full: np.ndarray) -> str:
    if a.ndim == 1:
        return _row(a, indent, opts)
    inner = _cut([_block(s, indent + 1, opts, full) for s in a], full, opts)
    inner = [" " * (indent + 1) + "..." if s == "..." else s for s in inner]
    pad = " " * indent
    return "\n".join([pad + opts["open_bracket"], *inner, pad + opts["close_bracket"]])


def poplar_text(title: str, a: np.ndarray, opts: Dict[str, Any]) -> str:
    """``"<title>: "`` then the tensor as Poplar lays it out.

    >>> from popxl_core.ops._print_format import print_options
    >>> opts = print_options(1000, 3, 75, 8, "auto", " ", "{", "}")
    >>> print(poplar_text("t", np.array([[1.5, 2.0], [0.25, 3.0]], np.float32), opts))
    t: {
     {1.5 2}
     {0.25 3}
    }
    """
    a = np.asarray(a)
    if a.ndim == 0:
        return f"{title}: {_value(a, opts)}"
    return f"{title}: {_block(a, 0, opts, a)}"
