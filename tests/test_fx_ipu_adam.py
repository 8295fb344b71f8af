"""`popxl_fx.IPUAdam` (Adam as the IPU var-updates compute it) and ``Options(numerics="ipu")``.

Reference: IPUAdam's own eager ``step`` on the eager model (same weights, same batches, 3
steps). training_model lowers it to ``accumulate_moving_average_``,
``accumulate_moving_average_square_``, ``adam_updater`` and ``scaled_add_``, whose kernels
the eager step writes out in torch, so losses, weights and the optimizer state (float16 first
moment included) are asserted bit for bit (measured worst difference: 0).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import popxl_fx

CONFIGS = [
    {"bias_correction": False, "first_order_dtype": torch.float16, "eps": 1e-5},
    {},
    {"weight_decay": 0.01},
]


def _batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 32, generator=g), torch.randint(0, 4, (8,), generator=g))] * 3


def _train_both(trainer, twin, eager_opt):
    """The trainer's and eager's losses, step by step, on the same batches."""
    for x, y in _batches():
        loss = trainer(x, y)
        eager_opt.zero_grad()
        eager = F.cross_entropy(twin(x), y)
        eager.backward()
        eager_opt.step()
        yield loss, eager.detach()


@pytest.mark.parametrize("kwargs", CONFIGS)
def test_ipu_adam_in_training_model_is_bitwise_its_eager_step(kwargs):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 16), nn.GELU(), nn.Linear(16, 4))
    twin = copy.deepcopy(model)
    opt = popxl_fx.IPUAdam(model.parameters(), lr=1e-2, **kwargs)
    eager_opt = popxl_fx.IPUAdam(twin.parameters(), lr=1e-2, **kwargs)
    trainer = popxl_fx.training_model(model, opt, F.cross_entropy, popxl_fx.Options(device="cpu"))
    for loss, eager in _train_both(trainer, twin, eager_opt):
        assert torch.equal(loss, eager)
    for k, v in twin.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    got, want = opt.state_dict()["state"], eager_opt.state_dict()["state"]
    for i in want:
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert got[i][key].dtype == want[i][key].dtype
            assert torch.equal(got[i][key], want[i][key]), (i, key)
    dtype = kwargs.get("first_order_dtype", torch.float32)
    assert all(s["exp_avg"].dtype == dtype for s in got.values())


def test_ipu_adam_and_numerics_bad_values():
    params = nn.Linear(2, 2).parameters()
    with pytest.raises(ValueError, match="first_order_dtype"):
        popxl_fx.IPUAdam(params, first_order_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="numerics"):
        popxl_fx.Options(numerics="fast")


def test_numerics_ipu_trains_like_eager_to_float32_round_off():
    """numerics="ipu": the IPU numerics' kernels, nn.Linear as MatMul then Add and the
    cross-entropy gradient in one op (`popxl_core.ops.nll_direct`); eager to float32
    round-off (measured worst: loss 0, weights 3.0e-8 after 3 SGD steps)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 16), nn.GELU(), nn.Linear(16, 4))
    twin = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    eager_opt = torch.optim.SGD(twin.parameters(), lr=0.1)
    options = popxl_fx.Options(device="cpu", numerics="ipu")
    trainer = popxl_fx.training_model(model, opt, F.cross_entropy, options)
    for loss, eager in _train_both(trainer, twin, eager_opt):
        assert torch.allclose(loss, eager, rtol=1e-6, atol=0)
    assert trainer.session.ir.numerics == "ipu"
    for k, v in twin.state_dict().items():
        assert torch.allclose(model.state_dict()[k], v, rtol=0, atol=1e-6), k
