"""Convolution, transposed convolution and F.pad lowerings against torch.

Tolerances: forward and gradients rtol 1e-5 / atol 1e-5 (float32 sums over up to 36 products
accumulate in a different order than torch's kernels)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from .fx_cases import Fn, randn, seq
from .fx_harness import check_lowering

X2, X1 = (2, 4, 9, 8), (2, 4, 11)

CONVS = {
    "conv2d": (lambda: nn.Conv2d(4, 6, 3), X2),
    "stride_pad_nobias": (lambda: nn.Conv2d(4, 6, 3, stride=2, padding=1, bias=False), X2),
    "groups_dilation": (
        lambda: nn.Conv2d(4, 8, (3, 2), groups=2, dilation=(2, 1), padding=(1, 2)),
        X2,
    ),
    "same_even_kernel": (lambda: nn.Conv2d(4, 6, 4, padding="same", dilation=2), X2),
    "valid": (lambda: nn.Conv2d(4, 6, 3, padding="valid"), X2),
    "reflect_depthwise": (
        lambda: nn.Conv2d(4, 4, 3, padding=2, padding_mode="reflect", groups=4),
        X2,
    ),
    "replicate": (lambda: nn.Conv2d(4, 6, 3, padding=1, padding_mode="replicate"), X2),
    "circular": (lambda: nn.Conv2d(4, 6, 3, padding=(1, 2), padding_mode="circular"), X2),
    "conv1d": (lambda: nn.Conv1d(4, 6, 3, stride=2, padding=1), X1),
    "conv1d_same_reflect": (lambda: nn.Conv1d(4, 6, 4, padding="same", padding_mode="reflect"), X1),
    "convT2d": (lambda: nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1), X2),
    "convT2d_groups_dilation": (
        lambda: nn.ConvTranspose2d(4, 6, 3, stride=(2, 1), groups=2, dilation=2),
        X2,
    ),
    "convT1d": (lambda: nn.ConvTranspose1d(4, 6, 5, stride=3, padding=2), X1),
}

FUNCTIONS = {
    "F.conv2d": (lambda x, w: F.conv2d(x, w, stride=2, groups=2, padding=1), (6, 2, 3, 3)),
    "F.conv_transpose2d": (lambda x, w: F.conv_transpose2d(x, w, stride=2, groups=2), (4, 3, 3, 3)),
    "torch.conv1d_same": (lambda x, w: torch.conv1d(x.flatten(2), w, padding="same"), (5, 4, 4)),
}

PADS = {
    "constant": lambda x: F.pad(x, (1, 2, 0, 3)),
    "constant_value_crop": lambda x: F.pad(x, (-1, 2), value=0.5),
    "reflect": lambda x: F.pad(x, (1, 2, 2, 3), mode="reflect"),
    "reflect_full": lambda x: F.pad(x.flatten(2), (71, 71), mode="reflect"),
    "replicate": lambda x: F.pad(x, (3, 0, 1, 4), mode="replicate"),
    "circular": lambda x: F.pad(x, (3, 2, 1, 1), mode="circular"),
}


@pytest.mark.parametrize("name", sorted(CONVS))
def test_conv_module(name):
    make, shape = CONVS[name]
    torch.manual_seed(0)
    check_lowering(seq(make()), randn(*shape), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_conv_function(name):
    fn, w_shape = FUNCTIONS[name]
    check_lowering(Fn(fn, 2), randn(*X2), randn(*w_shape, seed=1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(PADS))
def test_pad(name):
    # pads copy values: exact forward; gradients sum reflected copies in another order
    check_lowering(Fn(PADS[name]), randn(*X2), rtol=0, atol=0, grad_rtol=1e-6, grad_atol=1e-6)
