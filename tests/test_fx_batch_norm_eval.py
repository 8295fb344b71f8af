"""Batch norm in eval mode inside a trained model (frozen batch norm, as in fine-tuning) trains
bit for bit with eager: forward, input gradient, weight/bias gradients, running statistics
untouched. rtol=0 and atol=0 throughout: the inference-mode gradient is torch's own
native_batch_norm_backward(train=False), the kernel eager autograd runs.
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import popxl_fx
from popxl_core.ops.norm import _bn_grad_kernel
from popxl_fx.testing import assert_matches_eager


class _ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 16, 16)
        self.bn1 = nn.BatchNorm1d(16)
        self.out = nn.Linear(16, 5)

    def forward(self, x):
        x = F.avg_pool2d(F.relu(self.bn(self.conv(x))), 2).flatten(1)
        return self.out(F.relu(self.bn1(self.fc(x))))


def _model(frozen: bool) -> _ConvBN:
    """Train mode with both batch norms in eval mode, non-trivial statistics and affine
    parameters (so a wrong statistic, eps or gradient formula shows)."""
    torch.manual_seed(0)
    model = _ConvBN()
    with torch.no_grad():
        for bn in (model.bn, model.bn1):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)
            bn.num_batches_tracked.fill_(7)
    model.train()
    model.bn.eval()
    model.bn1.eval()
    for bn in (model.bn, model.bn1):
        bn.weight.requires_grad_(not frozen)
        bn.bias.requires_grad_(not frozen)
    return model


def _sgd(model):
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


@pytest.mark.parametrize("frozen", [False, True], ids=["bn_trained", "bn_frozen"])
def test_eval_mode_batch_norm_trains_bit_for_bit(frozen):
    sim = _model(frozen)
    eager = copy.deepcopy(sim)
    stats = {k: v.clone() for k, v in sim.state_dict().items() if "running" in k or "num_b" in k}
    eager_opt = _sgd(eager)
    trainer = popxl_fx.training_model(sim, _sgd(sim), F.cross_entropy)
    torch.manual_seed(1)
    for _ in range(2):  # two SGD-momentum steps, new data each step
        x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,))
        eager_opt.zero_grad()
        loss = F.cross_entropy(eager(x), y)
        loss.backward()
        eager_opt.step()
        assert torch.equal(torch.as_tensor(trainer(x, y)), loss.detach())
    for name, value in eager.state_dict().items():
        assert torch.equal(sim.state_dict()[name], value), name
    for name, value in stats.items():  # eval-mode batch norm leaves its statistics alone
        assert torch.equal(sim.state_dict()[name], value), name


def test_whole_model_in_eval_mode_compiled_matches_eager_bit_for_bit():
    model = _model(frozen=False).eval()
    torch.manual_seed(2)
    errors = assert_matches_eager(
        model,
        torch.randn(4, 3, 8, 8),
        targets=torch.randint(0, 5, (4,)),
        loss_fn=F.cross_entropy,
        steps=2,
        via="compile",
        rtol=0.0,
        atol=0.0,
    )
    assert errors["gradients"] == 0.0 and errors["parameters"] == 0.0


@pytest.mark.parametrize("shape", [(8, 24, 14, 14), (32, 40)])
def test_inference_batch_norm_gradient_is_eagers(shape):
    """The BatchNormalizationGrad kernel against eager autograd of F.batch_norm(training=False),
    on a reduction large enough (N*H*W = 1568) that another summation order shows."""
    torch.manual_seed(3)
    c = shape[1]
    x = torch.randn(shape, requires_grad=True)
    w = (torch.rand(c) + 0.5).requires_grad_()
    b = torch.randn(c, requires_grad=True)
    mean, var, dy = torch.randn(c) * 0.5, torch.rand(c) + 0.5, torch.randn(shape)
    y = F.batch_norm(x, mean, var, w, b, training=False, eps=1e-3)
    expected = torch.autograd.grad(y, (x, w, b), dy)
    got = _bn_grad_kernel(dy, x.detach(), w.detach(), mean, var, 1e-3)[:3]
    for name, g, e in zip(("dx", "dweight", "dbias"), got, expected):
        assert torch.equal(g, e), f"{name}: max diff {(g - e).abs().max().item():.3g}"
