"""``ops.interpolate`` (PopXL op type ``Resize``): ONNX Resize of every dim by a scale factor.

The output dim is ``floor(in * scale)``. Each output coordinate maps back to the input by
``coordinate_transformation_mode`` (ONNX: half_pixel, pytorch_half_pixel, align_corners,
asymmetric); ``nearest`` rounds it by ``nearest_mode``, ``linear`` interpolates between the two
neighbours and ``cubic`` between four (Keys, a = -0.75; edge values beyond the border).
Coordinates are float32, as on the IPU. The dims are resampled one after the other
(separable), so a result can differ from a 2-D kernel's summation order in the last bits.
"""

from __future__ import annotations

import math
from typing import Sequence, Tuple

import torch

from ..tensor import Tensor
from ._utils import rand, spec
from .registry import Cost, OpDef, Sample, create_op, register

__all__ = ["interpolate"]

_MODES = ("nearest", "linear", "cubic")
_NEAREST = {
    "round_prefer_floor": lambda x: torch.ceil(x - 0.5),
    "round_prefer_ceil": lambda x: torch.floor(x + 0.5),
    "floor": torch.floor,
    "ceil": torch.ceil,
}
_COORDS = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")


def _source_coords(n_in: int, n_out: int, scale: float, mode: str) -> torch.Tensor:
    """The input coordinate of each output index along one dim (ONNX's formulas)."""
    x = torch.arange(n_out, dtype=torch.float32)
    s = torch.tensor(scale, dtype=torch.float32)
    if mode == "asymmetric":
        return x / s
    if mode == "align_corners":
        if n_out == 1:
            return torch.zeros(1)
        return x * (n_in - 1) / (n_out - 1)
    if mode == "pytorch_half_pixel" and n_out == 1:
        return torch.zeros(1)
    return (x + 0.5) / s - 0.5


def _taps(n_in, n_out, scale, attrs) -> Tuple[list, list]:
    """Input indexes and weights of every output index along one dim: one tap (nearest) or
    two (linear)."""
    x = _source_coords(n_in, n_out, scale, attrs["coordinate_transformation_mode"])
    if attrs["mode"] == "nearest":
        idx = _NEAREST[attrs["nearest_mode"]](x).clamp(0, n_in - 1).long()
        return [idx], [None]
    if attrs["mode"] == "cubic":
        return _cubic_taps(x, n_in)
    x = x.clamp(0, n_in - 1)
    i0 = torch.floor(x)
    w1 = x - i0
    i0 = i0.long()
    return [i0, (i0 + 1).clamp(max=n_in - 1)], [1 - w1, w1]


_CUBIC_A = -0.75  # ONNX Resize's cubic_coeff_a default (and torch's bicubic)


def _cubic_taps(x: torch.Tensor, n_in: int) -> Tuple[list, list]:
    """Four taps (floor(x) - 1 .. floor(x) + 2, edge-clamped) with Keys' cubic weights."""
    x0 = torch.floor(x)
    t = x - x0
    a = _CUBIC_A

    def near(d):  # |d| <= 1
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d):  # 1 < |d| < 2
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    ws = [far(t + 1), near(t), near(1 - t), far(2 - t)]
    idxs = [(x0.long() + k).clamp(0, n_in - 1) for k in (-1, 0, 1, 2)]
    return idxs, ws


def _weight(w: torch.Tensor, rank: int, d: int, dtype) -> torch.Tensor:
    shape = [1] * rank
    shape[d] = -1
    return w.to(dtype).reshape(shape)


def _kernel(x, scale_factor, out_shape, **attrs):
    for d, s in enumerate(scale_factor):
        if s == 1.0:
            continue
        idxs, ws = _taps(x.shape[d], out_shape[d], s, attrs)
        if ws[0] is None:
            x = x.index_select(d, idxs[0])
            continue
        parts = [x.index_select(d, i) * _weight(w, x.dim(), d, x.dtype) for i, w in zip(idxs, ws)]
        x = sum(parts[1:], parts[0])
    return x


def _grad_kernel(dy, scale_factor, out_shape, input_shape, **attrs):
    for d in reversed(range(len(scale_factor))):
        s = scale_factor[d]
        if s == 1.0:
            continue
        idxs, ws = _taps(input_shape[d], out_shape[d], s, attrs)
        shape = list(dy.shape)
        shape[d] = input_shape[d]
        dx = torch.zeros(shape, dtype=dy.dtype)
        for i, w in zip(idxs, ws):
            dx.index_add_(d, i, dy if w is None else dy * _weight(w, dy.dim(), d, dy.dtype))
        dy = dx
    return dy


def _infer(ins, out_shape, **_):
    return [spec(out_shape, ins[0].dtype)]


def _grad(ctx):
    attrs = {**ctx.attrs, "input_shape": tuple(ctx.op.inputs[0].shape)}
    return [create_op(RESIZE_GRAD, [ctx.grad_output(0)], attrs)[0]]


def _cost(ins, outs, attrs) -> Cost:
    """Two multiply-adds per element and resampled dim for linear; nearest only copies."""
    big = max((*ins, *outs), key=lambda s: s.nelms)
    dims = sum(1 for s in attrs["scale_factor"] if s != 1.0)
    taps = {"nearest": 0, "linear": 2, "cubic": 4}[attrs["mode"]]
    flops = 2 * taps * dims * big.nelms
    return Cost(flops, sum(s.nbytes for s in (*ins, *outs)))


def _check(t: Tensor, scale_factor, mode, nearest_mode, ctm) -> Tuple[float, ...]:
    scales = tuple(float(s) for s in scale_factor)
    if len(scales) != t.rank:
        raise ValueError(
            f"interpolate: scale_factor needs one entry per dim of the rank-{t.rank} input "
            f"{t.shape}, got {len(scales)}: {scales}."
        )
    if any(s <= 0 for s in scales):
        raise ValueError(f"interpolate: scale factors must be positive, got {scales}.")
    _one_of("mode", mode, _MODES)
    _one_of("nearest_mode", nearest_mode, tuple(_NEAREST))
    _one_of("coordinate_transformation_mode", ctm, _COORDS)
    if not t.dtype.is_floating_point:
        raise TypeError(f"interpolate needs a floating point input, got {t.dtype.name}.")
    return scales


def _one_of(what: str, value, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"interpolate: {what} {value!r} is not one of {', '.join(allowed)}.")


def interpolate(
    t: Tensor,
    scale_factor: Sequence[float] = (1.0, 1.0, 1.0, 1.0),
    mode: str = "nearest",
    nearest_mode: str = "round_prefer_floor",
    coordinate_transformation_mode: str = "half_pixel",
) -> Tensor:
    """Resize every dim of ``t`` by ``scale_factor`` (one per dim): ``floor(in * scale)``.

    Args:
        t: floating point tensor of any rank.
        scale_factor: one positive factor per dim of ``t``.
        mode: "nearest", "linear" or "cubic" (Keys' cubic, a = -0.75, edge values beyond
            the border, as torch's bicubic).
        nearest_mode: how "nearest" rounds: "round_prefer_floor", "round_prefer_ceil",
            "floor" or "ceil".
        coordinate_transformation_mode: "half_pixel", "pytorch_half_pixel", "align_corners"
            or "asymmetric" (ONNX Resize).
    """
    scales = _check(t, scale_factor, mode, nearest_mode, coordinate_transformation_mode)
    out_shape = tuple(int(math.floor(n * s)) for n, s in zip(t.shape, scales))
    if min(out_shape, default=1) < 1:
        raise ValueError(
            f"interpolate: scale_factor {scales} makes {t.shape} an empty {out_shape}."
        )
    attrs = {
        "scale_factor": scales,
        "out_shape": out_shape,
        "mode": mode,
        "nearest_mode": nearest_mode,
        "coordinate_transformation_mode": coordinate_transformation_mode,
    }
    return create_op(RESIZE, [t], attrs, out_names=["resize_out"])[0]


# samples: torch's F.interpolate modes that are ONNX Resize settings ------------------------
def _torch(mode, scale, **kw):
    return lambda x: torch.nn.functional.interpolate(x, scale_factor=scale, mode=mode, **kw)


_CASES = [  # name, shape, scales, interpolate kwargs, torch reference
    (
        "nearest_up",
        (2, 3, 4, 5),
        (2.0, 3.0),
        dict(mode="nearest", nearest_mode="floor", coordinate_transformation_mode="asymmetric"),
        _torch("nearest", (2.0, 3.0)),
    ),
    (
        "nearest_down",
        (1, 2, 6, 8),
        (0.5, 0.5),
        dict(mode="nearest", nearest_mode="floor", coordinate_transformation_mode="asymmetric"),
        _torch("nearest", (0.5, 0.5)),
    ),
    (
        "nearest_exact",
        (2, 3, 4, 5),
        (2.0, 2.0),
        dict(mode="nearest", nearest_mode="round_prefer_ceil"),
        _torch("nearest-exact", (2.0, 2.0)),
    ),
    (
        "bilinear",
        (2, 3, 4, 5),
        (2.0, 2.0),
        dict(mode="linear"),
        _torch("bilinear", (2.0, 2.0), align_corners=False),
    ),
    (
        "bicubic",
        (2, 3, 4, 5),
        (2.0, 2.0),
        dict(mode="cubic"),
        _torch("bicubic", (2.0, 2.0), align_corners=False),
    ),
    (
        "bicubic_corners",
        (2, 3, 4, 5),
        (2.0, 2.0),
        dict(mode="cubic", coordinate_transformation_mode="align_corners"),
        _torch("bicubic", (2.0, 2.0), align_corners=True),
    ),
    (
        "bilinear_corners",
        (2, 3, 4, 5),
        (2.0, 2.0),
        dict(mode="linear", coordinate_transformation_mode="align_corners"),
        _torch("bilinear", (2.0, 2.0), align_corners=True),
    ),
]


def _samples():
    return [
        Sample(
            [rand(*shape, seed=400 + i)],
            lambda x, s=scales, kw=kw: interpolate(x, (1.0, 1.0, *s), **kw),
            ref,
            # separable dims sum in another order than torch's 2-D kernels; cubic's four taps
            # (and align_corners' coordinates, x * (in-1) / (out-1) against torch's
            # x * ((in-1) / (out-1))) round a little more
            rtol=1e-5 if kw["mode"] == "cubic" else 1e-6,
            atol=1e-5 if kw["mode"] == "cubic" else 1e-6,
            name=name,
        )
        for i, (name, shape, scales, kw, ref) in enumerate(_CASES)
    ]


def _grad_samples():
    dy = rand(2, 3, 8, 10, seed=420)
    attrs = {
        "scale_factor": (1.0, 1.0, 2.0, 2.0),
        "out_shape": (2, 3, 8, 10),
        "mode": "linear",
        "nearest_mode": "round_prefer_floor",
        "coordinate_transformation_mode": "half_pixel",
    }

    def build(d):
        return create_op(RESIZE_GRAD, [d], {**attrs, "input_shape": (2, 3, 4, 5)})[0]

    def ref(d):
        x = torch.zeros((2, 3, 4, 5), requires_grad=True)
        with torch.enable_grad():
            y = torch.nn.functional.interpolate(x, scale_factor=2.0, mode="bilinear")
            return torch.autograd.grad(y, x, d)[0]

    return [Sample([dy], build, ref, grad=False, rtol=1e-5, atol=1e-6)]


RESIZE = register(OpDef("Resize", _infer, _kernel, grad=_grad, cost=_cost, samples=_samples))
RESIZE_GRAD = register(
    OpDef(
        "ResizeGrad",
        lambda ins, input_shape, **_: [spec(input_shape, ins[0].dtype)],
        _grad_kernel,
        cost=_cost,
        samples=_grad_samples,
    )
)
