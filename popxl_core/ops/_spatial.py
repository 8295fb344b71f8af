"""Shared rules of the spatial ops (conv, conv_transpose, pooling) in ONNX conventions.

Pads are ONNX-ordered: all begins, then all ends, e.g. ``(h_begin, w_begin, h_end, w_end)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

__all__ = [
    "PAD_TYPES",
    "auto_pads",
    "check_rank",
    "effective_kernel",
    "is_symmetric",
    "prepad",
    "spatial_tuple",
    "torch_pads",
]

PAD_TYPES = ("not_set", "same_upper", "same_lower", "valid")


def spatial_tuple(value, n: int, what: str, default: int) -> tuple[int, ...]:
    """``value`` as ``n`` ints. None or () gives the default; popxl's 2-D defaults such as
    ``(1, 1)`` (every value equal to the default) fit any number of spatial dims."""
    if value is None:
        return (default,) * n
    vals = (int(value),) if isinstance(value, int) else tuple(int(v) for v in value)
    if len(vals) == n:
        return vals
    if all(v == default for v in vals):
        return (default,) * n
    raise ValueError(
        f"{what} {tuple(vals)} has {len(vals)} values; {n} are expected for this "
        "input's spatial dimensions"
    )


def check_rank(shape: Sequence[int], op: str) -> int:
    """The number of spatial dims of an NC... tensor (1 to 3)."""
    r = len(shape) - 2
    if not 1 <= r <= 3:
        raise ValueError(
            f"{op} expects an input of shape (N, C, *spatial) with 1 to 3 spatial "
            f"dimensions, got shape {tuple(shape)}"
        )
    return r


def effective_kernel(k: int, d: int) -> int:
    return d * (k - 1) + 1


def auto_pads(
    pad_type: str,
    sizes: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilation: Sequence[int],
    pads: Sequence[int] | None,
) -> tuple[int, ...]:
    """Explicit ONNX pads for ``pad_type`` ('not_set' keeps ``pads``)."""
    kind = str(pad_type).lower()
    if kind not in PAD_TYPES:
        raise ValueError(f"pad type {pad_type!r} is not one of {', '.join(PAD_TYPES)}")
    r = len(sizes)
    if kind == "not_set":
        return tuple(pads) if pads is not None else (0,) * (2 * r)
    if kind == "valid":
        return (0,) * (2 * r)
    begins: list[int] = []
    ends: list[int] = []
    for n, k, s, d in zip(sizes, kernel, strides, dilation):
        out = -(-n // s)
        total = max((out - 1) * s + effective_kernel(k, d) - n, 0)
        small, big = total // 2, total - total // 2
        begins.append(small if kind == "same_upper" else big)
        ends.append(big if kind == "same_upper" else small)
    return tuple(begins + ends)


def torch_pads(pads: Sequence[int]) -> list[int]:
    """ONNX pads -> the argument of ``F.pad`` (last dim first, begin then end)."""
    r = len(pads) // 2
    out: list[int] = []
    for i in reversed(range(r)):
        out += [pads[i], pads[r + i]]
    return out


def is_symmetric(pads: Sequence[int]) -> bool:
    r = len(pads) // 2
    return all(pads[i] == pads[r + i] >= 0 for i in range(r))


def prepad(x: torch.Tensor, pads: Sequence[int], value: float = 0.0) -> torch.Tensor:
    """``x`` padded (negative pads crop) on its spatial dims."""
    return F.pad(x, torch_pads(pads), value=value) if any(pads) else x
