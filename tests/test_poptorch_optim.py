"""poptorch.optim in a training executor: RMSprop (and its TF variant), LAMB, AdamW without
bias correction and max_grad_norm, against the same optimizer's eager step (with torch's
clip_grad_norm_ for max_grad_norm), bit for bit."""

import copy

import pytest
import torch
from torch import nn

import popxl_fx.poptorch as poptorch


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(10, 10)

    def forward(self, x):
        y = torch.nn.functional.log_softmax(self.lin(x), -1)
        return y, poptorch.identity_loss(y**2, reduction="sum")


OPTIMIZERS = {
    "rmsprop": lambda ps: poptorch.optim.RMSprop(ps, lr=0.01, centered=True, momentum=0.9),
    "rmsprop_tf": lambda ps: poptorch.optim.RMSprop(ps, lr=0.01, use_tf_variant=True),
    "lamb": lambda ps: poptorch.optim.LAMB(ps, lr=0.01),
    "lamb_no_bias": lambda ps: poptorch.optim.LAMB(ps, lr=0.01, bias_correction=False),
    "adamw_no_bias": lambda ps: poptorch.optim.AdamW(ps, lr=0.01, bias_correction=False),
    "sgd_clipped": lambda ps: poptorch.optim.SGD(ps, lr=0.01, max_grad_norm=0.001),
    "adam_clipped": lambda ps: poptorch.optim.Adam(ps, lr=0.01, max_grad_norm=0.001),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_training_matches_the_eager_optimizer(name):
    make = OPTIMIZERS[name]
    torch.manual_seed(0)
    model = _Model()
    eager = copy.deepcopy(model)
    ipu = poptorch.trainingModel(model, optimizer=make(model.parameters()))
    eager_opt = make(eager.parameters())
    x = torch.randn(10)
    for _ in range(4):
        _, loss = ipu(x)
        eager_opt.zero_grad()
        _, eager_loss = eager(x)
        eager_loss.backward()
        if "clipped" in name:
            torch.nn.utils.clip_grad_norm_(eager.parameters(), 0.001)
        eager_opt.step()
        assert torch.equal(loss, eager_loss.detach())
    assert torch.equal(model.lin.weight, eager.lin.weight)
    assert torch.equal(model.lin.bias, eager.lin.bias)


def test_tf_variant_and_no_bias_correction_change_the_numbers():
    def trained(make):
        torch.manual_seed(0)
        model = _Model()
        ipu = poptorch.trainingModel(model, optimizer=make(model.parameters()))
        for _ in range(2):
            ipu(torch.ones(10))
        return model.lin.weight.detach()

    plain = trained(lambda ps: poptorch.optim.RMSprop(ps, lr=0.01))
    assert not torch.equal(plain, trained(OPTIMIZERS["rmsprop_tf"]))
    adamw = trained(lambda ps: poptorch.optim.AdamW(ps, lr=0.01))
    assert not torch.equal(adamw, trained(OPTIMIZERS["adamw_no_bias"]))
