"""`popxl_fx.program.signature_of` walks the modules itself (it runs before every step): the
modes must be exactly ``model.modules()``'s, in its order, for shared and missing children."""

from __future__ import annotations

import torch
from torch import nn

from popxl_fx.program import signature_of
from tests.fx_zoo import GPT


def _torch_modes(model: nn.Module) -> tuple:
    return tuple(m.training for m in model.modules())


def test_modes_follow_named_modules_order_with_shared_and_none_children():
    shared = nn.Linear(2, 2)
    inner = nn.Sequential(nn.ReLU(), shared, nn.Dropout())
    model = nn.Sequential(nn.Identity(), inner, shared, nn.ModuleList([inner, nn.Tanh()]))
    model.register_module("missing", None)
    x = torch.zeros(1, 2)
    for i, m in enumerate(model.modules()):  # a pattern that shows a wrong order
        m.train(i % 3 == 0)
    assert signature_of(model, (x,))[1] == _torch_modes(model)
    assert len(signature_of(model, (x,))[1]) == len(list(model.modules()))
    inner[2].eval()
    shared.train()
    assert signature_of(model, (x,))[1] == _torch_modes(model)


def test_modes_see_mode_and_structure_changes():
    model = GPT()
    x = (torch.zeros(2, 16, dtype=torch.long),) * 2
    before = signature_of(model, x)
    assert before[1] == _torch_modes(model)
    model.blocks[0].eval()
    assert signature_of(model, x)[1] == _torch_modes(model) != before[1]
    model.extra = nn.Linear(1, 1)  # a new submodule changes the signature's length
    assert signature_of(model, x)[1] == _torch_modes(model)
    assert len(signature_of(model, x)[1]) == len(before[1]) + 1
