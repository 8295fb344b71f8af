"""More table entries against torch: math functions, elementwise binaries, functional norms,
3-d convolution/pooling/normalisation and the remaining method/function spellings.

Tolerances: rtol 1e-5 / atol 1e-5."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from .fx_cases import Fn, randn, seq
from .fx_harness import check_lowering

TOL = dict(rtol=1e-5, atol=1e-5)

UNARY = {
    "math": lambda x: (
        torch.sin(x)
        + x.cos()
        + torch.log1p(x.abs())
        + torch.expm1(x)
        + torch.log10(x.abs() + 1)
        + (x.abs() + 1).log2()
        + torch.reciprocal(x.abs() + 1)
    ),
    "rounding": lambda x: torch.floor(x * 3) + (x * 3).ceil() + torch.sign(x) * torch.square(x),
    "binary": lambda x: (
        torch.maximum(x, x.flip(0))
        - torch.minimum(x, 0.3 * x)
        + torch.rsub(x, 2.0, alpha=0.5)
        + torch.add(x, x, alpha=2)
        + torch.sub(x, 1, alpha=3)
    ),
    "clone_detach_type_as": lambda x: x.clone() * x.detach() + x.type_as(x).contiguous(),
    "prelu_leaky": lambda x: F.prelu(x, torch.tensor([0.1, 0.2, 0.3])) + F.leaky_relu(x),
    "functional_norms": lambda x: F.layer_norm(x, (5,)) + F.group_norm(x, 3) + F.instance_norm(x),
    "std_mean_dims": lambda x: torch.std_mean(x, (0, 2))[0],
    "swapdims_narrow": lambda x: torch.swapdims(x, 0, 1).narrow(0, 1, 2),
    "dot_addmv": lambda x: (
        torch.addmv(x[0, 0], x[0, :, :].t(), x[1, 0, :3] * 0 + x[1, :, 0])
        + torch.dot(x[0, 0], x[1, 1])
    ),
    "dropout_functional_eval": lambda x: (
        F.dropout(x, 0.5, training=False) + F.dropout1d(x, 0.3, training=False)
    ),
    "upsample_functional": lambda x: F.upsample(x, scale_factor=2, mode="linear"),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_more_functions(name):
    check_lowering(Fn(UNARY[name]), randn(2, 3, 5), **TOL)


X3 = (2, 4, 5, 6, 7)
MODULES3D = {
    "conv3d": nn.Conv3d(4, 3, 3, padding=1, stride=(1, 2, 2)),
    "conv_transpose3d": nn.ConvTranspose3d(4, 2, 2, stride=2),
    "max_pool3d": nn.MaxPool3d(2, ceil_mode=True),
    "avg_pool3d": nn.AvgPool3d(3, 2, 1),
    "adaptive_avg_pool3d": nn.AdaptiveAvgPool3d((2, 3, 4)),
    "batch_norm3d": nn.BatchNorm3d(4),
    "instance_norm3d": nn.InstanceNorm3d(4, affine=True),
    "dropout3d_eval": nn.Dropout3d(0.5).eval(),
}


@pytest.mark.parametrize("name", sorted(MODULES3D))
def test_3d_modules(name):
    torch.manual_seed(0)
    check_lowering(seq(MODULES3D[name]), randn(*X3), **TOL)


def test_stochastic_depth_batch_mode_eval():
    from torchvision.ops import stochastic_depth

    fn = lambda x: stochastic_depth(x, 0.5, "batch", training=False)
    check_lowering(Fn(fn), randn(2, 3), rtol=0, atol=0)
