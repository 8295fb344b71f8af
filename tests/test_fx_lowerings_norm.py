"""Normalisation lowerings against torch: outputs, gradients and (train mode) the running
statistics and num_batches_tracked buffers after one forward.

Tolerances: rtol 1e-5 / atol 1e-5 (mean/variance reductions in a different order)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from .fx_cases import randn, seq
from .fx_harness import check_lowering

X2, X1, X0 = (3, 4, 7, 6), (5, 4, 7), (6, 4)

NORMS = {
    "bn2d_train": (lambda: nn.BatchNorm2d(4), X2),
    "bn2d_momentum_none": (lambda: nn.BatchNorm2d(4, momentum=None), X2),
    "bn1d_3d_input": (lambda: nn.BatchNorm1d(4, momentum=0.3), X1),
    "bn1d_2d_input_no_affine": (lambda: nn.BatchNorm1d(4, affine=False), X0),
    "bn2d_no_running_stats": (lambda: nn.BatchNorm2d(4, track_running_stats=False), X2),
    "bn2d_eval": (lambda: _with_stats(nn.BatchNorm2d(4)).eval(), X2),
    "layernorm": (lambda: nn.LayerNorm(6), X2),
    "layernorm_2dims_no_affine": (lambda: nn.LayerNorm((7, 6), elementwise_affine=False), X2),
    "layernorm_no_bias": (lambda: nn.LayerNorm(7, bias=False), X1),
    "groupnorm": (lambda: nn.GroupNorm(2, 4), X2),
    "groupnorm_no_affine": (lambda: nn.GroupNorm(4, 4, affine=False), X1),
    "instancenorm2d": (lambda: nn.InstanceNorm2d(4), X2),
    "instancenorm1d_affine": (lambda: nn.InstanceNorm1d(4, affine=True), X1),
    "instancenorm2d_running_stats": (lambda: nn.InstanceNorm2d(4, track_running_stats=True), X2),
    "instancenorm2d_eval_stats": (
        lambda: _with_stats(nn.InstanceNorm2d(4, track_running_stats=True)).eval(),
        X2,
    ),
}


def _with_stats(m: nn.Module) -> nn.Module:
    g = torch.Generator().manual_seed(5)
    m.running_mean.copy_(torch.randn(4, generator=g))
    m.running_var.copy_(torch.rand(4, generator=g) + 0.5)
    return m


@pytest.mark.parametrize("name", sorted(NORMS))
def test_norm_module(name):
    make, shape = NORMS[name]
    torch.manual_seed(0)
    model = seq(make())
    for p in model.parameters():  # not the trivial ones/zeros init
        p.data.uniform_(0.5, 1.5)
    check_lowering(model, randn(*shape, scale=2.0, shift=1.0), rtol=1e-5, atol=1e-5)


def test_batchnorm_momentum_none_is_cumulative_over_steps():
    model = seq(nn.BatchNorm2d(4, momentum=None))
    model[0].num_batches_tracked.fill_(3)  # the 4th batch gets weight 1/4
    model[0].running_mean.fill_(0.5)
    check_lowering(model, randn(*X2, scale=2.0), rtol=1e-5, atol=1e-5)


def test_functional_batch_norm_updates_the_model_buffers():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("mean", torch.zeros(4))
            self.register_buffer("var", torch.ones(4))
            self.scale = nn.Parameter(torch.rand(4) + 0.5)

        def forward(self, x):
            return F.batch_norm(x, self.mean, self.var, self.scale, None, True, 0.2)

    check_lowering(Net(), randn(*X2, scale=2.0), rtol=1e-5, atol=1e-5)


def test_functional_batch_norm_eval_reads_the_buffers():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("mean", torch.rand(4))
            self.register_buffer("var", torch.rand(4) + 0.5)

        def forward(self, x):
            return F.batch_norm(x, self.mean, self.var, None, None, False, eps=1e-3)

    check_lowering(Net(), randn(*X2, scale=2.0), rtol=1e-5, atol=1e-5)
