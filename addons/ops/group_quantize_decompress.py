"""4-bit group-quantised weights (FlexGen, arXiv:2303.06865): popxl.addons'
``GroupQuantizeDecompress`` custom op and the numpy compression it undoes.

A weight is cut into groups of ``group_size`` along one axis; each group keeps its minimum
(the bias) and ``(max - min) / 15`` (the scale), and each element becomes the nearest of 16
levels, four of them packed into a uint16 (the first in the top bits).
"""

from __future__ import annotations

from typing import Tuple

import numpy as np
import torch

import popxl_core as popxl
from popxl_core import Tensor, TensorSpec
from popxl_core.ops.registry import Cost, OpDef, Sample, create_op, no_grad, register

__all__ = [
    "group_quantize_decompress",
    "group_quantize_compress_numpy",
    "group_quantize_decompress_numpy",
    "GROUP_QUANTIZE_DECOMPRESS",
]

_SHIFTS = (12, 8, 4, 0)


def _move_last(x, dim: int):
    """The last axis of ``x`` moved to ``dim``."""
    if dim == -1:
        return x
    perm = list(range(x.ndim))
    perm.insert(dim, perm.pop(-1))
    return x.transpose(*perm)


def group_quantize_decompress_numpy(
    t: np.ndarray, group_scale: np.ndarray, group_bias: np.ndarray, dim: int = -1
) -> np.ndarray:
    """Unpack ``t`` (..., groups, ids) uint16 and rescale: float16 (..., groups * ids * 4)
    with that axis moved to ``dim`` (default last: popxl.addons' tests call it without)."""
    nibbles = np.stack([(t >> s) & 15 for s in _SHIFTS], axis=-1)
    levels = nibbles.reshape(*t.shape[:-1], -1).astype(np.float16)
    out = (levels * group_scale + group_bias).reshape(*t.shape[:-2], -1)
    return _move_last(out, dim)


def group_quantize_compress_numpy(
    t: np.ndarray, group_size: int, dim: int = -1
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(packed uint16, scale, bias)`` of ``t`` grouped by ``group_size`` along ``dim``;
    ValueError for non-finite values (a group's scale would be NaN)."""
    if not np.isfinite(t).all():
        raise ValueError("Cannot compress t which contains non-finite values")
    x = np.moveaxis(np.asarray(t, np.float16), dim, -1)
    groups = x.reshape(*x.shape[:-1], x.shape[-1] // group_size, group_size).astype(np.float32)
    low, high = groups.min(-1, keepdims=True), groups.max(-1, keepdims=True)
    scale = (high - low) / 15
    levels = np.round((groups - low) / np.where(scale == 0, 1, scale)).clip(0, 15)
    quads = levels.astype(np.uint16).reshape(*groups.shape[:-1], group_size // 4, 4)
    packed = sum(quads[..., i] << s for i, s in enumerate(_SHIFTS)).astype(np.uint16)
    return packed, scale.astype(np.float16), low.astype(np.float16)


def _infer(ins):
    t, scale, bias = ins
    if len(t.shape) != 3 or t.dtype != popxl.uint16:
        raise ValueError(f"group_quantize_decompress takes uint16 (rows, groups, ids); got {t}")
    want = (*t.shape[:2], 1)
    if tuple(scale.shape) != want or tuple(bias.shape) != want:
        raise ValueError(
            f"group scale and bias must have shape {want}; got {scale.shape}, {bias.shape}"
        )
    return [TensorSpec((t.shape[0], t.shape[1] * t.shape[2] * 4), scale.dtype)]


def _kernel(t, scale, bias):
    # uint16 has few torch kernels: widen to int32 for the shifts
    wide = t.to(torch.int32)
    nibbles = torch.stack([(wide >> s) & 15 for s in _SHIFTS], dim=-1)
    levels = nibbles.reshape(*t.shape[:-1], -1).to(scale.dtype)
    return (levels * scale + bias).reshape(t.shape[0], -1)


def _torch_reference(t, scale, bias):
    """The levels read by integer division (not the kernel's shifts), each float16 product and
    sum rounded: (rows, groups * ids * 4)."""
    wide = t.to(torch.int64)
    levels = torch.stack([wide // 16**k % 16 for k in (3, 2, 1, 0)], -1).flatten(-2)
    return (levels.to(torch.float16) * scale + bias).flatten(1)


def _samples():
    rng = np.random.default_rng(0)
    w = rng.uniform(-1, 1, (3, 16)).astype(np.float16)
    packed, scale, bias = group_quantize_compress_numpy(w, 8, -1)
    return [
        Sample(
            [packed, scale, bias],
            lambda t, s, b: group_quantize_decompress(t, s, b),
            _torch_reference,
            grad=False,
            rtol=0,
            atol=0,
        )
    ]


GROUP_QUANTIZE_DECOMPRESS = register(
    OpDef(
        "GroupQuantizeDecompress",
        lambda ins: _infer(ins),
        kernel=_kernel,
        grad=no_grad,
        cost=lambda ins, outs, attrs: Cost(2 * outs[0].nelms, sum(s.nbytes for s in (*ins, *outs))),
        samples=_samples,
        out_name="t_decompressed",
        fp16_in_fp32=False,  # each float16 product and sum rounded, as the numpy reference
    )
)


def group_quantize_decompress(
    t: Tensor, group_scale: Tensor, group_bias: Tensor, dim: int = -1
) -> Tensor:
    """Unpack ``t`` (rows, groups, ids) uint16 and rescale by ``group_scale`` and
    ``group_bias`` (rows, groups[, 1]): (rows, groups * ids * 4), that axis moved to ``dim``."""
    if group_scale.rank == 2:
        group_scale = group_scale.reshape((*group_scale.shape, 1))
    if group_bias.rank == 2:
        group_bias = group_bias.reshape((*group_bias.shape, 1))
    out = create_op(GROUP_QUANTIZE_DECOMPRESS, [t, group_scale, group_bias])[0]
    if dim == -1:
        return out
    perm = list(range(out.rank))
    perm.insert(dim, perm.pop(-1))
    return out.transpose(perm)
