"""Pooling lowerings against torch (max/avg with padding, ceil_mode, count_include_pad,
dilation, divisor_override; adaptive avg/max to dividing and non-dividing sizes).

Tolerances: rtol 1e-5 / atol 1e-6 (max pooling is exact; averages are float32 sums)."""

import pytest
import torch.nn.functional as F
from torch import nn

from .fx_cases import Fn, randn, seq
from .fx_harness import check_lowering

X2, X1 = (2, 3, 9, 8), (2, 3, 11)

POOLS = {
    "max_pad_stride": (nn.MaxPool2d(3, 2, 1), X2),
    "max_ceil": (nn.MaxPool2d(2, ceil_mode=True), X2),
    "max1d_dilation": (nn.MaxPool1d(3, 2, dilation=2), X1),
    "avg_pad_counts_pad": (nn.AvgPool2d(3, 2, 1), X2),
    "avg_ceil_no_pad_count": (nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False), X2),
    "avg_ceil_counts_pad": (nn.AvgPool2d(3, 2, 1, ceil_mode=True), X2),
    "avg_ceil": (nn.AvgPool2d(2, ceil_mode=True), X2),
    "avg1d": (nn.AvgPool1d(3, 2, 1), X1),
    "avg_divisor_override": (nn.AvgPool2d(2, divisor_override=3), X2),
    "adaptive_avg_non_dividing": (nn.AdaptiveAvgPool2d((4, 5)), X2),
    "adaptive_avg_global": (nn.AdaptiveAvgPool2d(1), X2),
    "adaptive_avg_dividing": (nn.AdaptiveAvgPool2d((3, 4)), X2),
    "adaptive_avg_none": (nn.AdaptiveAvgPool2d((None, 3)), X2),
    "adaptive_avg_upsamples": (nn.AdaptiveAvgPool2d(7), (2, 3, 2, 2)),
    "adaptive_avg1d": (nn.AdaptiveAvgPool1d(4), X1),
    "adaptive_max_non_dividing": (nn.AdaptiveMaxPool2d((4, 5)), X2),
    "adaptive_max_dividing": (nn.AdaptiveMaxPool2d((3, 2)), X2),
}

FUNCTIONS = {
    "F.max_pool2d": lambda x: F.max_pool2d(x, 2),
    "F.avg_pool2d": lambda x: F.avg_pool2d(x, (2, 3), stride=1),
    "F.adaptive_avg_pool2d": lambda x: F.adaptive_avg_pool2d(x, (1, 1)),
    "F.adaptive_max_pool2d": lambda x: F.adaptive_max_pool2d(x, 2),
}


@pytest.mark.parametrize("name", sorted(POOLS))
def test_pool_module(name):
    module, shape = POOLS[name]
    check_lowering(seq(module), randn(*shape), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_pool_function(name):
    check_lowering(Fn(FUNCTIONS[name]), randn(*X2), rtol=1e-5, atol=1e-6)
