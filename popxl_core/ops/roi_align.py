"""RoiAlign (ONNX opset 10, average mode): a fixed-size feature patch per region of interest.

Each region ``[x1, y1, x2, y2]`` (input pixels, scaled by ``spatial_scale``, no half-pixel
offset, at least one pixel wide) is cut into ``output_size`` bins; a bin averages
``sampling_ratio`` x ``sampling_ratio`` bilinearly interpolated points (0: as many as the bin
is pixels wide, rounded up). Points more than one pixel outside the image count as 0. This is
``torchvision.ops.roi_align(..., aligned=False)``, the reference the samples use.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from ..tensor import Tensor
from ._utils import rand, spec
from .registry import Cost, OpDef, Sample, create_op, register

__all__ = ["roi_align"]


def _infer(ins, output_size, spatial_scale, sampling_ratio):
    x, rois, idx = ins
    if len(x.shape) != 4 or not x.dtype.is_floating_point:
        raise ValueError(
            f"roi_align needs a floating point (N, C, H, W) input, got {x.dtype.name} {x.shape}"
        )
    if len(rois.shape) != 2 or rois.shape[1] != 4 or rois.dtype != x.dtype:
        raise ValueError(
            f"rois must be (num_rois, 4) {x.dtype.name} [x1, y1, x2, y2], got "
            f"{rois.dtype.name} {rois.shape}"
        )
    if not idx.dtype.is_int or tuple(idx.shape) != (rois.shape[0],):
        raise ValueError(
            f"batch_index must be an integer ({rois.shape[0]},) tensor, got "
            f"{idx.dtype.name} {idx.shape}"
        )
    return [spec((rois.shape[0], x.shape[1], *output_size), x.dtype)]


def _axis_points(start, size, bins: int, grid: int) -> torch.Tensor:
    """Sample coordinates along one axis: (num_rois, bins * grid)."""
    step = size / bins
    offs = torch.arange(bins * grid, dtype=start.dtype) // grid
    frac = (torch.arange(bins * grid, dtype=start.dtype) % grid + 0.5) / grid
    return start[:, None] + (offs + frac)[None, :] * step[:, None]


def _weights(p: torch.Tensor, n: int):
    """Low/high neighbour indices and weights of bilinear interpolation (torchvision's rule)."""
    valid = (p >= -1.0) & (p <= n)
    p = p.clamp(min=0)
    low = p.floor().long().clamp(max=n - 1)
    at_edge = low >= n - 1
    p = torch.where(at_edge, low.to(p.dtype), p)
    high = torch.where(at_edge, low, low + 1).clamp(max=n - 1)
    w_high = p - low.to(p.dtype)
    w_low = 1 - w_high
    return low, high, w_low * valid, w_high * valid


def _align_group(x, b, x1, y1, w, h, out_hw, grid):
    """Regions that share a sampling grid: (R, C, out_h, out_w)."""
    (oh, ow), (gh, gw) = out_hw, grid
    ys = _axis_points(y1, h, oh, gh)  # (R, oh*gh)
    xs = _axis_points(x1, w, ow, gw)
    yl, yh, wyl, wyh = _weights(ys, x.shape[2])
    xl, xh, wxl, wxh = _weights(xs, x.shape[3])
    feat = x[b]  # (R, C, H, W)
    r = torch.arange(len(b))[:, None, None]

    def at(yi, xi):
        return feat[r, :, yi[:, :, None], xi[:, None, :]]  # (R, Py, Px, C)

    val = (
        at(yl, xl) * (wyl[:, :, None] * wxl[:, None, :])[..., None]
        + at(yl, xh) * (wyl[:, :, None] * wxh[:, None, :])[..., None]
        + at(yh, xl) * (wyh[:, :, None] * wxl[:, None, :])[..., None]
        + at(yh, xh) * (wyh[:, :, None] * wxh[:, None, :])[..., None]
    )
    val = val.reshape(len(b), oh, gh, ow, gw, -1).mean(dim=(2, 4))
    return val.permute(0, 3, 1, 2)


def _kernel(x, rois, idx, output_size, spatial_scale, sampling_ratio):
    oh, ow = output_size
    box = rois.to(x.dtype) * spatial_scale
    w = (box[:, 2] - box[:, 0]).clamp(min=1.0)
    h = (box[:, 3] - box[:, 1]).clamp(min=1.0)
    if sampling_ratio > 0:
        grids = [(sampling_ratio, sampling_ratio)] * len(rois)
    else:
        grids = [(math.ceil(hh / oh), math.ceil(ww / ow)) for hh, ww in zip(h.tolist(), w.tolist())]
    out = x.new_zeros((len(rois), x.shape[1], oh, ow))
    for grid in sorted(set(grids)):
        sel = torch.tensor([g == grid for g in grids])
        out[sel] = _align_group(
            x, idx.long()[sel], box[sel, 0], box[sel, 1], w[sel], h[sel], (oh, ow), grid
        )
    return out


def _grad_kernel(dy, rois, idx, input_shape, **attrs):
    x = dy.new_zeros(input_shape).requires_grad_()
    with torch.enable_grad():
        return torch.autograd.grad(_kernel(x, rois, idx, **attrs), x, dy)[0]


def _grad(ctx):
    rois, idx = ctx.input(1), ctx.input(2)
    attrs = {"input_shape": ctx.op.inputs[0].shape, **ctx.attrs}
    return [create_op(ROI_ALIGN_GRAD, [ctx.grad_output(0), rois, idx], attrs)[0], None, None]


def _cost(ins, outs, attrs) -> Cost:
    """Four reads and a multiply-add per sampling point (adaptive grids counted as 2 x 2)."""
    grid = attrs["sampling_ratio"] if attrs["sampling_ratio"] > 0 else 2
    pooled = outs[0] if "input_shape" not in attrs else ins[0]
    return Cost(pooled.nelms * grid * grid * 8, sum(s.nbytes for s in (*ins, *outs)))


def _reference(output_size, spatial_scale, sampling_ratio):
    def ref(x, rois, idx):
        from torchvision.ops import roi_align as tv_roi_align

        boxes = torch.cat([idx[:, None].to(x.dtype), rois], dim=1)
        return tv_roi_align(x, boxes, output_size, spatial_scale, sampling_ratio, aligned=False)

    return ref


def _samples():
    x = rand(2, 3, 9, 11, seed=210)
    rois = rand(7, 4, low=-4.0, high=24.0, seed=211)  # some outside, some inverted boxes
    idx = torch.tensor([0, 1, 1, 0, 1, 0, 0], dtype=torch.int32).numpy()
    cases = [((3, 2), 0.5, 2, "ratio2"), ((2, 4), 0.4, 0, "adaptive"), ((1, 1), 1.0, 1, "1x1")]
    return [
        Sample(
            [x, rois, idx],
            lambda a, r, i, o=o, s=s, n=n: roi_align(a, r, i, o, s, n),
            _reference(o, s, n),
            name=name,
        )
        for o, s, n, name in cases
    ]


def _grad_samples():
    x, rois = rand(1, 2, 6, 7, seed=220), rand(3, 4, low=0.0, high=8.0, seed=221)
    idx = torch.zeros(3, dtype=torch.int32).numpy()
    dy = rand(3, 2, 2, 3, seed=222)
    attrs = {"output_size": (2, 3), "spatial_scale": 1.0, "sampling_ratio": 2}

    def build(d, r, i, shape=x.shape):
        return create_op(ROI_ALIGN_GRAD, [d, r, i], {"input_shape": shape, **attrs})[0]

    def ref(d, r, i):
        xt = torch.zeros(x.shape, dtype=d.dtype, requires_grad=True)
        with torch.enable_grad():
            return torch.autograd.grad(_reference(**attrs)(xt, r, i), xt, d)[0]

    return [Sample([dy, rois, idx], build, ref, grad=False)]


ROI_ALIGN = register(
    OpDef(
        "RoiAlign",
        _infer,
        _kernel,
        grad=_grad,
        cost=_cost,
        samples=_samples,
        out_name="roialign_out",
    )
)
ROI_ALIGN_GRAD = register(
    OpDef(
        "RoiAlignGrad",
        lambda ins, input_shape, **_: [spec(input_shape, ins[0].dtype)],
        _grad_kernel,
        cost=_cost,
        samples=_grad_samples,
        out_name="roialign_grad_out",
    )
)


def roi_align(
    t: Tensor,
    rois: Tensor,
    batch_index: Tensor,
    output_size: Sequence[int],
    spatial_scale: float,
    sampling_ratio: int,
) -> Tensor:
    """Average-pool each region of interest of ``t`` into an ``output_size`` patch.

    Args:
        t: (N, C, H, W) features.
        rois: (num_rois, 4) boxes ``[x1, y1, x2, y2]`` in input coordinates (before
            ``spatial_scale``).
        batch_index: (num_rois,) integers, the image of ``t`` each box is cut from.
        output_size: (out_h, out_w).
        spatial_scale: multiplies box coordinates into ``t``'s pixel coordinates.
        sampling_ratio: sampling points per bin and axis; 0 means ceil(bin size).

    Returns:
        (num_rois, C, out_h, out_w).
    """
    size = tuple(int(s) for s in output_size)
    if len(size) != 2 or min(size) < 1 or int(sampling_ratio) < 0:
        raise ValueError(
            f"roi_align: output_size must be two positive ints and sampling_ratio "
            f">= 0, got {tuple(output_size)} and {sampling_ratio}"
        )
    attrs = {
        "output_size": size,
        "spatial_scale": float(spatial_scale),
        "sampling_ratio": int(sampling_ratio),
    }
    return create_op(ROI_ALIGN, [t, rois, batch_index], attrs)[0]
