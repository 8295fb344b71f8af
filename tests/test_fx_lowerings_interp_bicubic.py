"""F.interpolate / nn.Upsample lowered to the ``Upsample`` op against eager torch, forward and
gradients (random cotangent) of every mode: bicubic (align_corners True/False, size and
scale_factor, up and down), and the nearest/linear modes' backward.

Tolerance: none. The op's kernels are torch's ``aten.upsample_*`` and their backward kernels,
so outputs and gradients are bitwise equal (rtol=0, atol=0)."""

import pytest
import torch.nn.functional as F
from torch import nn

from .fx_cases import Fn, randn, seq
from .fx_harness import check_lowering, lowered_ops

EXACT = dict(rtol=0, atol=0)

BICUBIC = {
    "size_up": dict(size=(7, 9)),
    "size_up_ac": dict(size=(7, 9), align_corners=True),
    "size_down": dict(size=(3, 2)),
    "size_down_ac": dict(size=(3, 2), align_corners=True),
    "scale_int": dict(scale_factor=2),
    "scale_frac_ac": dict(scale_factor=(1.5, 0.75), align_corners=True),
    "scale_frac": dict(scale_factor=1.7),
    "scale_recompute": dict(scale_factor=1.7, recompute_scale_factor=True),
}


@pytest.mark.parametrize("name", sorted(BICUBIC))
def test_bicubic(name):
    kwargs = BICUBIC[name]
    check_lowering(
        Fn(lambda x: F.interpolate(x, mode="bicubic", **kwargs)), randn(2, 3, 4, 5), **EXACT
    )


def test_bicubic_lowers_to_one_upsample_op():
    ops_ = lowered_ops(
        Fn(lambda x: F.interpolate(x, size=(7, 9), mode="bicubic")), randn(1, 1, 4, 5)
    )
    assert ops_ == ["Upsample"]


def test_bicubic_upsample_module():
    check_lowering(seq(nn.Upsample(scale_factor=2, mode="bicubic")), randn(2, 3, 4, 5), **EXACT)


OTHERS = {
    "nearest_size": (lambda x: F.interpolate(x, size=(7, 9)), (2, 3, 4, 5)),
    "nearest_down_frac": (lambda x: F.interpolate(x, scale_factor=0.6), (2, 3, 4, 5)),
    "nearest_exact": (lambda x: F.interpolate(x, size=(3, 7), mode="nearest-exact"), (2, 3, 4, 5)),
    "nearest_1d": (lambda x: F.interpolate(x, scale_factor=2.5), (2, 3, 5)),
    "nearest_3d": (lambda x: F.interpolate(x, size=(5, 3, 7)), (1, 2, 3, 4, 5)),
    "linear_1d_ac": (
        lambda x: F.interpolate(x, size=11, mode="linear", align_corners=True),
        (2, 3, 5),
    ),
    "bilinear": (lambda x: F.interpolate(x, size=(7, 9), mode="bilinear"), (2, 3, 4, 5)),
    "bilinear_ac": (
        lambda x: F.interpolate(x, size=(7, 3), mode="bilinear", align_corners=True),
        (2, 3, 4, 5),
    ),
    "bilinear_scale": (lambda x: F.interpolate(x, scale_factor=1.5, mode="bilinear"), (2, 3, 4, 5)),
    "trilinear": (
        lambda x: F.interpolate(x, scale_factor=(2, 1.5, 0.5), mode="trilinear"),
        (1, 2, 3, 4, 5),
    ),
}


@pytest.mark.parametrize("name", sorted(OTHERS))
def test_other_modes_forward_and_backward_are_exact(name):
    fn, shape = OTHERS[name]
    check_lowering(Fn(fn), randn(*shape), **EXACT)


@pytest.mark.parametrize(
    "module",
    [nn.UpsamplingBilinear2d(scale_factor=2), nn.UpsamplingNearest2d(size=5)],
    ids=repr,
)
def test_upsampling_modules_are_exact(module):
    check_lowering(seq(module), randn(2, 3, 4, 5), **EXACT)


@pytest.mark.parametrize(
    "kwargs",
    [dict(size=(7, 9), mode="bicubic", antialias=True), dict(size=(3, 2), mode="area")],
    ids=["antialias", "area"],
)
def test_interpolate_options_without_a_popxl_op_run_torchs_kernel(kwargs):
    # antialiasing and "area" have no PopXL upsample: torch's own kernel, bit for bit
    check_lowering(Fn(lambda x: F.interpolate(x, **kwargs)), randn(1, 1, 4, 5), **EXACT)
