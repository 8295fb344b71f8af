"""Text of a `print_tensor` op: PopXL's options (summarise threshold, edge items, line width,
digits, float format, separator and brackets) applied with numpy's array printer."""

from __future__ import annotations

from typing import Any, Dict

import numpy as np

from ._poplar_print import poplar_text

__all__ = ["FLOAT_FORMATS", "LAYOUTS", "print_options", "format_tensor"]

FLOAT_FORMATS = ("auto", "fixed", "scientific", "none")
LAYOUTS = ("numpy", "poplar")


def print_options(
    summarise_threshold: int,
    edge_items: int,
    max_line_width: int,
    digits: int,
    float_format: str,
    separator: str,
    open_bracket: str,
    close_bracket: str,
    layout: str = "numpy",
) -> Dict[str, Any]:
    """The op attribute holding the print options; raises on an unknown float format.
    ``layout`` "poplar" writes Poplar's nested lines (see `_poplar_print`), "numpy" numpy's."""
    if layout not in LAYOUTS:
        raise ValueError(f"print_tensor: layout must be one of {LAYOUTS}, got {layout!r}")
    if float_format not in FLOAT_FORMATS:
        raise ValueError(
            f"print_tensor: float_format must be one of {FLOAT_FORMATS}, got {float_format!r}"
        )
    return dict(
        threshold=int(summarise_threshold),
        edgeitems=int(edge_items),
        linewidth=int(max_line_width),
        digits=int(digits),
        float_format=float_format,
        separator=str(separator),
        open_bracket=str(open_bracket),
        close_bracket=str(close_bracket),
        layout=layout,
    )


def _float_formatter(float_format: str, digits: int):
    if float_format == "fixed":
        return {"float_kind": lambda v: f"{v:.{digits}f}"}
    if float_format == "scientific":
        return {"float_kind": lambda v: f"{v:.{digits}e}"}
    return None


def format_tensor(title: str, a: np.ndarray, opts: Dict[str, Any]) -> str:
    """``"<title>: <values>"`` with PopXL's brackets and separator.

    >>> format_tensor("x", np.array([0.0, 1.5]), print_options(1000, 3, 75, 8, "auto", " ",
    ...                                                           "|", "|"))
    'x: |0.  1.5|'
    """
    if opts.get("layout") == "poplar":
        return poplar_text(title, a, opts)
    body = np.array2string(
        np.asarray(a),
        max_line_width=opts["linewidth"],
        precision=opts["digits"],
        separator=opts["separator"],
        threshold=opts["threshold"],
        edgeitems=opts["edgeitems"],
        floatmode="unique" if opts["float_format"] == "none" else "maxprec",
        formatter=_float_formatter(opts["float_format"], opts["digits"]),
    )
    # numbers never contain brackets, so swapping them is safe
    body = body.replace("[", "\0").replace("]", opts["close_bracket"])
    return f"{title}: {body.replace(chr(0), opts['open_bracket'])}"
