"""Upsample: torch's ``F.interpolate`` resampling (nearest, nearest-exact, linear, bilinear,
trilinear, bicubic) of the spatial dims of an (N, C, *spatial) tensor, with torch's
source-index rules (``align_corners``, explicit ``scales``).

Not a PopXL op: PopXL's ``interpolate`` (type ``Resize``) follows ONNX's coordinate modes. This
one exists so torch models resample with the exact kernels of ``aten.upsample_*`` and their
backward kernels, bit for bit (the frontend's ``F.interpolate`` lowers to it).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from ..tensor import Tensor
from ._utils import rand, spec
from .registry import Cost, OpDef, Sample, create_op, register

__all__ = ["upsample"]

aten = torch.ops.aten

# mode -> (spatial rank -> aten kernel name stem), whether it takes align_corners
_KERNELS = {
    "nearest": ({1: "upsample_nearest1d", 2: "upsample_nearest2d", 3: "upsample_nearest3d"}, False),
    "nearest-exact": (
        {
            1: "_upsample_nearest_exact1d",
            2: "_upsample_nearest_exact2d",
            3: "_upsample_nearest_exact3d",
        },
        False,
    ),
    "linear": ({1: "upsample_linear1d"}, True),
    "bilinear": ({2: "upsample_bilinear2d"}, True),
    "trilinear": ({3: "upsample_trilinear3d"}, True),
    "bicubic": ({2: "upsample_bicubic2d"}, True),
}
# input elements read per output element (the cost model's multiply-adds)
_TAPS = {
    "nearest": 0,
    "nearest-exact": 0,
    "linear": 2,
    "bilinear": 4,
    "trilinear": 8,
    "bicubic": 16,
}


def _stem(mode: str, rank: int) -> str:
    return _KERNELS[mode][0][rank]


def _scale_args(scales: Optional[Sequence[Optional[float]]], rank: int) -> list:
    return list(scales) if scales is not None else [None] * rank


def _kernel(x, mode, output_size, align_corners, scales):
    fn = getattr(aten, _stem(mode, len(output_size))).default
    corners = [align_corners] if _KERNELS[mode][1] else []
    return fn(x, list(output_size), *corners, *_scale_args(scales, len(output_size)))


def _grad_kernel(dy, mode, output_size, align_corners, scales, input_shape):
    fn = getattr(aten, _stem(mode, len(output_size)) + "_backward").default
    corners = [align_corners] if _KERNELS[mode][1] else []
    size, shape = list(output_size), list(input_shape)
    return fn(dy, size, shape, *corners, *_scale_args(scales, len(output_size)))


def _infer(ins, mode, output_size, align_corners, scales):
    x = ins[0]
    return [spec((*x.shape[:2], *output_size), x.dtype)]


def _grad(ctx):
    attrs = {**ctx.attrs, "input_shape": tuple(ctx.op.inputs[0].shape)}
    return [create_op(UPSAMPLE_GRAD, [ctx.grad_output(0)], attrs)[0]]


def _cost(ins, outs, attrs) -> Cost:
    """A multiply-add per tap and output element (nearest only copies)."""
    out = outs[0] if "input_shape" not in attrs else ins[0]
    flops = 2 * _TAPS[attrs["mode"]] * out.nelms
    return Cost(flops, sum(s.nbytes for s in (*ins, *outs)))


def _check(t: Tensor, mode: str, size: tuple, align_corners, scales) -> None:
    rank = len(t.shape) - 2
    if mode not in _KERNELS:
        raise ValueError(f"upsample: mode {mode!r} is not one of {', '.join(_KERNELS)}")
    if rank not in _KERNELS[mode][0]:
        ranks = "/".join(f"{2 + r}-d" for r in _KERNELS[mode][0])
        raise ValueError(f"upsample: mode {mode!r} needs a {ranks} input, got shape {t.shape}")
    if not t.dtype.is_floating_point:
        raise ValueError(f"upsample needs a floating point input, got {t.dtype.name}")
    if len(size) != rank or min(size) < 1:
        raise ValueError(f"upsample: output_size must be {rank} positive ints, got {size}")
    if align_corners is not None and not _KERNELS[mode][1]:
        raise ValueError(
            f"upsample: align_corners only applies to interpolating modes, not {mode!r}"
        )
    if scales is not None and len(scales) != rank:
        raise ValueError(f"upsample: scales must have {rank} entries, got {scales}")


def upsample(
    t: Tensor,
    output_size: Sequence[int],
    mode: str = "nearest",
    align_corners: Optional[bool] = None,
    scales: Optional[Sequence[Optional[float]]] = None,
) -> Tensor:
    """Resample the spatial dims of ``t`` (N, C, *spatial) to ``output_size`` like torch.

    Args:
        t: floating point (N, C, L), (N, C, H, W) or (N, C, D, H, W) tensor.
        output_size: the new spatial sizes.
        mode: "nearest", "nearest-exact", "linear" (3-d), "bilinear" (4-d), "trilinear" (5-d)
            or "bicubic" (4-d).
        align_corners: for the interpolating modes (None means False); None for nearest.
        scales: the scale factor of each spatial dim, as ``F.interpolate`` passes them when
            called with ``scale_factor`` (they set the source-index ratio instead of
            input / output size); None otherwise.

    Returns:
        (N, C, *output_size), the same dtype.
    """
    size = tuple(int(s) for s in output_size)
    _check(t, mode, size, align_corners, scales)
    corners = bool(align_corners) if _KERNELS[mode][1] else None
    scl = None if scales is None else tuple(None if s is None else float(s) for s in scales)
    attrs = {"mode": mode, "output_size": size, "align_corners": corners, "scales": scl}
    return create_op(UPSAMPLE, [t], attrs)[0]


def _torch_reference(size, mode, align_corners, scales):
    def ref(x):
        if scales is not None:
            return torch.nn.functional.interpolate(
                x, scale_factor=scales, mode=mode, align_corners=align_corners
            )
        return torch.nn.functional.interpolate(x, size=size, mode=mode, align_corners=align_corners)

    return ref


_CASES = [  # name, input shape, output size, mode, align_corners, scales
    ("nearest2d", (2, 3, 4, 5), (7, 9), "nearest", None, None),
    ("nearest_exact1d", (2, 3, 5), (3,), "nearest-exact", None, None),
    ("nearest3d_scale", (1, 2, 3, 4, 5), (6, 8, 7), "nearest", None, (2.0, 2.0, 1.5)),
    ("linear1d_ac", (2, 3, 5), (11,), "linear", True, None),
    ("bilinear", (2, 3, 4, 5), (7, 9), "bilinear", False, None),
    ("trilinear_scale", (1, 2, 3, 4, 5), (4, 6, 7), "trilinear", False, (1.5, 1.5, 1.5)),
    ("bicubic", (2, 3, 4, 5), (7, 9), "bicubic", False, None),
    ("bicubic_ac_down", (2, 3, 6, 7), (4, 3), "bicubic", True, None),
    ("bicubic_scale", (1, 2, 4, 5), (6, 7), "bicubic", False, (1.5, 1.5)),
]


def _samples():
    return [
        Sample(
            [rand(*shape, seed=300 + i)],
            lambda x, s=size, m=mode, a=ac, sc=scl: upsample(x, s, m, a, sc),
            _torch_reference(size, mode, ac, scl),
            rtol=0,
            atol=0,
            name=name,
        )
        for i, (name, shape, size, mode, ac, scl) in enumerate(_CASES)
    ]


def _grad_samples():
    dy = rand(2, 3, 7, 9, seed=320)
    attrs = {"mode": "bicubic", "output_size": (7, 9), "align_corners": False, "scales": None}

    def build(d):
        return create_op(UPSAMPLE_GRAD, [d], {**attrs, "input_shape": (2, 3, 4, 5)})[0]

    def ref(d):
        x = torch.zeros((2, 3, 4, 5), requires_grad=True)
        with torch.enable_grad():
            y = torch.nn.functional.interpolate(x, size=(7, 9), mode="bicubic")
            return torch.autograd.grad(y, x, d)[0]

    return [Sample([dy], build, ref, grad=False, rtol=0, atol=0)]


UPSAMPLE = register(OpDef("Upsample", _infer, _kernel, grad=_grad, cost=_cost, samples=_samples))
UPSAMPLE_GRAD = register(
    OpDef(
        "UpsampleGrad",
        lambda ins, input_shape, **_: [spec(input_shape, ins[0].dtype)],
        _grad_kernel,
        cost=_cost,
        samples=_grad_samples,
    )
)
