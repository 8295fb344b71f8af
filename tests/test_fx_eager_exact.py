"""Conv-net building blocks compute eager PyTorch's float32 arithmetic bit for bit.

The simulator runs the aten kernels eager autograd runs (convolution with its bias and
convolution_backward, native_batch_norm and its backward with torch's running-statistics
update, max_pool2d_with_indices, hardtanh/threshold, silu/sigmoid/hardswish backward,
adaptive_avg_pool2d, log_softmax/nll_loss backward), so forward outputs, gradients and
batch-norm buffers are equal to eager's exactly (rtol=0, atol=0), not just close. That is what
lets badly conditioned models (test_fx_models.py's torchvision CNNs) match eager for several
steps. `compile` mode is used: torch's own optimizer then updates the parameters, so two steps
also check that the second forward/backward starts from identical weights.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from popxl_fx import Options, testing
from popxl_fx.testing import assert_matches_eager, compare


def _head(c: int) -> list[nn.Module]:
    return [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 10)]


def _conv(cin: int = 3, cout: int = 8, bias: bool = False) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, padding=1, bias=bias)


def _basic_block() -> nn.Module:
    from torchvision.models.resnet import BasicBlock

    down = nn.Sequential(nn.Conv2d(8, 16, 1, 2, bias=False), nn.BatchNorm2d(16))
    return nn.Sequential(_conv(), nn.BatchNorm2d(8), BasicBlock(8, 16, 2, down), *_head(16))


def _inverted_residual() -> nn.Module:
    from torchvision.models.mobilenetv2 import InvertedResidual

    return nn.Sequential(_conv(), InvertedResidual(8, 8, 1, 6), *_head(8))


def _mbconv() -> nn.Module:
    from torchvision.models.efficientnet import MBConv, MBConvConfig

    norm = partial(nn.BatchNorm2d, eps=1e-3)
    block = MBConv(MBConvConfig(6, 3, 1, 8, 8, 1), 0.0, norm)
    return nn.Sequential(_conv(), block, *_head(8))


BLOCKS = {
    "conv_bias_bn_relu": lambda: nn.Sequential(
        _conv(bias=True), nn.BatchNorm2d(8), nn.ReLU(), *_head(8)
    ),
    "bn_momentum_none_relu6": lambda: nn.Sequential(
        _conv(), nn.BatchNorm2d(8, momentum=None), nn.ReLU6(), *_head(8)
    ),
    "maxpool_hardswish": lambda: nn.Sequential(
        _conv(), nn.MaxPool2d(3, 2, 1), nn.Hardswish(), *_head(8)
    ),
    "silu_sigmoid_hardsigmoid": lambda: nn.Sequential(
        _conv(), nn.SiLU(), _conv(8, 8), nn.Sigmoid(), _conv(8, 8), nn.Hardsigmoid(), *_head(8)
    ),
    # vgg's classifier input: 2x2 maps pooled up to 7x7 (overlapping adaptive bins)
    "adaptive_avg_pool_up": lambda: nn.Sequential(
        _conv(), nn.AdaptiveAvgPool2d(7), nn.Flatten(), nn.Linear(8 * 49, 10)
    ),
    "resnet_basic_block": _basic_block,
    "mobilenet_inverted_residual": _inverted_residual,
    "efficientnet_mbconv_se": _mbconv,
}


def _inputs(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    size = 2 if name == "adaptive_avg_pool_up" else 8
    return torch.randn(4, 3, size, size, generator=g), torch.randint(0, 10, (4,), generator=g)


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_block_is_bitwise_eager(name):
    torch.manual_seed(0)
    x, y = _inputs(name)
    errors = assert_matches_eager(
        BLOCKS[name](),
        x,
        targets=y,
        loss_fn=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
        steps=2,
        options=Options(device="cpu"),
        rtol=0.0,
        atol=0.0,
        via="compile",
    )
    assert set(errors) >= {"loss", "outputs", "gradients", "parameters"}


def test_compare_finds_one_ulp_in_any_chunk(monkeypatch):
    """`compare` works through large tensors a chunk at a time: a single-ulp difference in
    the last chunk, or a NaN on one side only, still fails at rtol=atol=0. The chunk is made
    1024 elements here (4M in use), so the same two chunks (a full one, then 5) are small."""
    monkeypatch.setattr(testing, "_CHUNK", 1 << 10)
    expected = torch.linspace(1.0, 2.0, (1 << 10) + 5)
    actual = expected.clone()
    assert compare("same", actual, expected, 0.0, 0.0) == 0.0
    actual[-1] = torch.nextafter(actual[-1], torch.tensor(3.0))
    with pytest.raises(AssertionError, match=r"1 of 1029 values beyond rtol=0.0"):
        compare("last", actual, expected, 0.0, 0.0)
    assert compare("tolerated", actual, expected, 1e-6, 0.0) > 0.0
    actual = expected.clone()
    actual[3] = float("nan")
    with pytest.raises(AssertionError, match="1 of"):
        compare("nan", actual, expected, 1.0, 1.0)
    with pytest.raises(AssertionError, match="values beyond"):
        compare("normwise", expected + 1e-3, expected, 1e-4, 0.0, normwise=True)
