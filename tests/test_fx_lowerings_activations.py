"""Activation lowerings (modules and functions) against torch: forward at rtol 1e-5 /
atol 1e-6, gradients for a random cotangent at the same tolerance (float32 composites of
exp/log/tanh differ from torch's fused kernels by a few ulps)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from .fx_cases import Fn, randn, seq
from .fx_harness import check_lowering

MODULES = [
    nn.ReLU(),
    nn.ReLU6(),
    nn.LeakyReLU(0.2),
    nn.ELU(0.7),
    nn.SELU(),
    nn.CELU(0.5),
    nn.GELU(),
    nn.GELU("tanh"),
    nn.SiLU(),
    nn.Mish(),
    nn.Hardswish(),
    nn.Hardsigmoid(),
    nn.Hardtanh(-2.0, 2.0),
    nn.Sigmoid(),
    nn.Tanh(),
    nn.Softplus(),
    nn.Softplus(2.0, 5.0),
    nn.Softsign(),
    nn.LogSigmoid(),
    nn.GLU(1),
    nn.PReLU(4),
    nn.PReLU(),
]

FUNCTIONS = {
    "F.relu": F.relu,
    "relu_method": lambda x: x.relu(),
    "F.relu6": F.relu6,
    "F.leaky_relu": lambda x: F.leaky_relu(x, 0.1),
    "F.elu": F.elu,
    "F.selu": F.selu,
    "F.gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "F.gelu": F.gelu,
    "F.silu": F.silu,
    "F.mish": F.mish,
    "F.hardswish": F.hardswish,
    "F.hardsigmoid": F.hardsigmoid,
    "torch.sigmoid": lambda x: x.sigmoid(),
    "torch.tanh": lambda x: x.tanh(),
    "F.softplus": F.softplus,
    "F.softsign": F.softsign,
    "F.logsigmoid": F.logsigmoid,
    "F.glu": lambda x: F.glu(x, -2),
    "F.hardtanh": F.hardtanh,
}


@pytest.mark.parametrize("module", MODULES, ids=lambda m: repr(m))
def test_activation_module(module):
    check_lowering(seq(module), randn(2, 4, 6, scale=3.0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_activation_function(name):
    check_lowering(Fn(FUNCTIONS[name]), randn(2, 4, 6, scale=3.0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "module", [nn.ReLU(), nn.ReLU6(), nn.Hardtanh(-1.0, 2.0), nn.Hardsigmoid()], ids=repr
)
def test_gradient_at_the_kinks_follows_torch(module):
    # values exactly at the bounds: torch's hardtanh/relu6/relu pass no gradient there
    x = torch.tensor([[-3.0, -1.0, 0.0, 2.0, 3.0, 6.0, 0.5, 7.0]])
    check_lowering(seq(module), x, rtol=1e-6, atol=1e-7)


def test_softplus_large_inputs_do_not_overflow():
    # beyond the threshold softplus is x; the soft branch must not produce inf/NaN gradients
    check_lowering(seq(nn.Softplus()), randn(3, 5, scale=60.0), rtol=1e-5, atol=1e-6)
