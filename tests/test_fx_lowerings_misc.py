"""Creation ops, triu/tril, dropout (identity in eval and at p=0; seeded otherwise) and
interpolation lowerings against torch.

Tolerances: creation and nearest interpolation exact; linear interpolation rtol 1e-5 /
atol 1e-6 (weights applied as a matrix product instead of torch's 2-tap sum)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from .fx_cases import Fn, randn, seq
from .fx_harness import check_lowering, lowered_ops

# torch.arange/zeros/ones/full/eye with constant shapes are folded into constants by capture
CREATION = {
    "arange_plus_x": lambda x: x + torch.arange(5),
    "arange_float_step": lambda x: x * torch.arange(0.5, 3.0, 0.5),
    "zeros_ones_full": lambda x: (
        x + torch.zeros(3, 5) * torch.ones((1, 5)) - torch.full((3, 5), 2.5)
    ),
    "eye": lambda x: x[:, :3] @ torch.eye(3, 5),
    "zeros_like": lambda x: torch.zeros_like(x) + x,
    "ones_like_dtype": lambda x: torch.ones_like(x, dtype=torch.int64),
    "full_like": lambda x: torch.full_like(x, 3.0) * x,
    "new_zeros": lambda x: x.new_zeros(3, 5) + x,
    "new_ones": lambda x: x.new_ones((3, 1)) * x,
    "new_full": lambda x: x.new_full((1, 5), 2.0) * x,
    "triu": lambda x: torch.triu(x, 1),
    "tril_method": lambda x: x.tril(-1),
    "float_cast_of_comparison": lambda x: (x > 0).float() * x,
    "to_dtype": lambda x: x.to(torch.int32).to(torch.float32),
    "masked_fill": lambda x: x.masked_fill(x < 0, -1.5),
    "mixed_dtypes_promote": lambda x: (x.half() * 2 + x) + x.argmax(1, keepdim=True),
    "where_scalar": lambda x: torch.where(x > 0, x, 0.0),
    "clamp": lambda x: x.clamp(-0.5, 0.7),
    "clamp_min": lambda x: torch.clamp(x, min=0.1),
    "scalar_arith": lambda x: (2.0 - x) / 3 + 1 / (x * x + 1) - 2**x + x**2,
    "comparisons": lambda x: (x >= 0.2) & (x < 0.8) | (x == x[0]) ^ (x != 0.1),
    "rsqrt_exp_log": lambda x: torch.rsqrt(x * x + 1) + (x.abs() + 1).log() + x.exp(),
}


@pytest.mark.parametrize("name", sorted(CREATION))
def test_creation_and_elementwise(name):
    check_lowering(Fn(CREATION[name]), randn(3, 5), rtol=1e-6, atol=1e-6)


def test_floor_division_and_remainder_follow_torch_signs():
    # torch has no derivative for floor_divide: forward only, exact
    fn = lambda x: torch.cat(
        [(x * 3) // 2, (x * 3) % 2, torch.div(x * 3, 2, rounding_mode="trunc")]
    )
    check_lowering(Fn(fn), randn(3, 5), rtol=0, atol=1e-6, grad=False)


@pytest.mark.parametrize(
    "module",
    [nn.Dropout(0.3).eval(), nn.Dropout(0.0), nn.Dropout2d(0.5).eval(), nn.Dropout3d(0.0)],
    ids=repr,
)
def test_dropout_is_identity_in_eval_or_at_zero(module):
    check_lowering(seq(module), randn(2, 3, 4, 5), rtol=0, atol=0)


def test_dropout_in_training_draws_torchs_noise():
    # Options(rng="torch"), the default: eager's noise (tests/test_fx_random_torch.py)
    assert "TorchRandom" in lowered_ops(seq(nn.Dropout(0.5)), randn(2, 3))
    assert "TorchRandom" in lowered_ops(seq(nn.Dropout2d(0.5)), randn(2, 3, 4, 4))


def test_stochastic_depth_in_eval_is_identity():
    from torchvision.ops import StochasticDepth

    check_lowering(seq(StochasticDepth(0.2, "row")).eval(), randn(2, 3, 4), rtol=0, atol=0)
    assert "TorchRandom" in lowered_ops(seq(StochasticDepth(0.2, "row")), randn(2, 3, 4))


INTERP = {
    "nearest_size": lambda x: F.interpolate(x, size=(7, 9)),
    "nearest_scale": lambda x: F.interpolate(x, scale_factor=2),
    "nearest_down_frac": lambda x: F.interpolate(x, scale_factor=0.6),
    "nearest_exact": lambda x: F.interpolate(x, size=(3, 7), mode="nearest-exact"),
    "bilinear": lambda x: F.interpolate(x, size=(7, 9), mode="bilinear", align_corners=False),
    "bilinear_ac": lambda x: F.interpolate(x, size=(7, 3), mode="bilinear", align_corners=True),
    "bilinear_scale": lambda x: F.interpolate(x, scale_factor=1.5, mode="bilinear"),
    "linear_1d": lambda x: F.interpolate(x.flatten(2), size=11, mode="linear"),
}


@pytest.mark.parametrize("name", sorted(INTERP))
def test_interpolate(name):
    exact = name.startswith("nearest")
    tol = (
        dict(rtol=0, atol=0, grad_rtol=1e-6, grad_atol=1e-6)
        if exact
        else dict(rtol=1e-5, atol=1e-6)
    )
    check_lowering(Fn(INTERP[name]), randn(2, 3, 4, 5), **tol)


@pytest.mark.parametrize(
    "module",
    [
        nn.Upsample(scale_factor=2),
        nn.Upsample(size=(6, 8), mode="bilinear"),
        nn.UpsamplingBilinear2d(scale_factor=2),
        nn.UpsamplingNearest2d(size=5),
    ],
    ids=repr,
)
def test_upsample_modules(module):
    check_lowering(seq(module), randn(2, 3, 4, 5), rtol=1e-5, atol=1e-6)
