"""poptorch.optim with float16 weights: PopTorch's accumulator dtypes (float32 unless given),
float32 hyper-parameters and a float32 update rounded once to float16. The training executor
matches the optimizer's eager step bit for bit, and both match a float64 computation of that
rule to one float16 rounding."""

import copy

import pytest
import torch
from torch import nn

import popxl_fx.poptorch as poptorch

_F16 = {"first_order_momentum_accum_type": torch.float16}
OPTIMIZERS = {
    "adamw": lambda ps, **kw: poptorch.optim.AdamW(ps, lr=0.01, weight_decay=0.1, **kw),
    "adam": lambda ps, **kw: poptorch.optim.Adam(ps, lr=0.01, **kw),
    "sgd": lambda ps, **kw: poptorch.optim.SGD(ps, lr=0.01, momentum=0.9, **kw),
    "lamb": lambda ps, **kw: poptorch.optim.LAMB(ps, lr=0.01, **kw),
    "rmsprop": lambda ps, **kw: poptorch.optim.RMSprop(ps, lr=0.01, **kw),
}


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return poptorch.identity_loss(self.lin(x) ** 2, reduction="sum")


def _data():
    x = torch.randn(2, 4).half()
    x[:, 0] = 0  # the weights' first column has a zero gradient: Adam's 0 / (0 + eps)
    return x


def _eager_steps(model, opt, x, steps):
    for _ in range(steps):
        opt.zero_grad()
        model(x).backward()
        opt.step()


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_half_weights_train_as_the_eager_step(name):
    torch.manual_seed(0)
    model, x = _Model().half(), _data()
    eager = copy.deepcopy(model)
    ipu = poptorch.trainingModel(model, optimizer=OPTIMIZERS[name](model.parameters()))
    for _ in range(3):
        ipu(x)
    _eager_steps(eager, OPTIMIZERS[name](eager.parameters()), x, 3)
    assert torch.isfinite(model.lin.weight).all()
    assert torch.equal(model.lin.weight, eager.lin.weight)
    assert torch.equal(model.lin.bias, eager.lin.bias)


KEEP_WORKING = {
    "adamw_clipped": lambda ps: poptorch.optim.AdamW(ps, lr=0.01, max_grad_norm=0.01),
    "sgd_scaled": lambda ps: poptorch.optim.SGD(
        ps, lr=0.01, momentum=0.9, velocity_scaling=8.0, loss_scaling=64.0
    ),
    "adamw_loss_scaled": lambda ps: poptorch.optim.AdamW(ps, lr=0.01, loss_scaling=1024.0),
    "lamb_half_state": lambda ps: poptorch.optim.LAMB(
        ps, lr=0.01, second_order_momentum_accum_type=torch.float16
    ),
}


@pytest.mark.parametrize("name", sorted(KEEP_WORKING))
def test_scaling_clipping_and_half_state_with_half_weights(name):
    torch.manual_seed(0)
    model, x = _Model().half(), _data()
    eager = copy.deepcopy(model)
    ipu = poptorch.trainingModel(model, optimizer=KEEP_WORKING[name](model.parameters()))
    eager_opt = KEEP_WORKING[name](eager.parameters())
    for _ in range(3):
        ipu(x)
        eager_opt.zero_grad()
        eager(x).backward()
        if "clipped" in name:
            torch.nn.utils.clip_grad_norm_(eager.parameters(), 0.01)
        eager_opt.step()
    assert torch.isfinite(model.lin.weight).all()
    assert torch.equal(model.lin.weight, eager.lin.weight)
    assert torch.equal(model.lin.bias, eager.lin.bias)


def _adamw64(p, g, lr=0.01, wd=0.1, betas=(0.9, 0.999), eps=1e-8):
    """One AdamW step from zero state in float64."""
    p, g = p.double(), g.double()
    m, v = (1 - betas[0]) * g, (1 - betas[1]) * g * g
    denom = (v / (1 - betas[1])).sqrt() + eps
    return p * (1 - lr * wd) - lr * (m / (1 - betas[0])) / denom


def _adam64(p, g):
    return _adamw64(p, g, wd=0.0)


def _sgd64(p, g, lr=0.01):
    return p.double() - lr * g.double()


def _rmsprop64(p, g, lr=0.01, alpha=0.99, eps=1e-8):
    g = g.double()
    return p.double() - lr * g / (((1 - alpha) * g * g).sqrt() + eps)


def _lamb64(p, g, lr=0.01, wd=1e-2, eps=1e-8):
    """One step of PopTorch's LAMB from zero state (bias corrected, max_weight_norm 65500)."""
    p, g = p.double(), g.double()
    upd = g / (g.abs() + eps) + wd * p  # m / bc1 = g, sqrt(v) / bc2_sqrt = |g|
    trust = p.norm().clamp(max=65500.0) / upd.norm()
    return p - lr * trust * upd


@pytest.mark.parametrize(
    "name, ref",
    [
        ("adamw", _adamw64),
        ("adam", _adam64),
        ("sgd", _sgd64),
        ("rmsprop", _rmsprop64),
        ("lamb", _lamb64),
    ],
)
def test_the_eager_step_is_the_float64_rule_rounded_once(name, ref):
    torch.manual_seed(1)
    p = nn.Parameter(torch.randn(64).half())
    p.grad = torch.randn(64).half() * 1e-3
    p.grad[:8] = 0
    want = ref(p.detach(), p.grad)
    OPTIMIZERS[name]([p]).step()
    assert torch.isfinite(p).all()
    # float32 arithmetic then one rounding: at most one float16 ulp from float64's
    ulp = torch.finfo(torch.float16).eps * want.abs().clamp(min=2**-14)
    assert ((p.double() - want).abs() <= ulp).all()


def test_accumulators_are_float32_unless_given_float16():
    torch.manual_seed(0)
    model, x = _Model().half(), _data()
    eager = copy.deepcopy(model)
    opt = OPTIMIZERS["adam"](model.parameters(), **_F16)
    poptorch.trainingModel(model, optimizer=opt)(x)
    eager_opt = OPTIMIZERS["adam"](eager.parameters(), **_F16)
    _eager_steps(eager, eager_opt, x, 1)
    for o in (opt, eager_opt):
        state = next(iter(o.state.values()))
        assert state["exp_avg"].dtype == torch.float16
        assert state["exp_avg_sq"].dtype == torch.float32
    assert torch.equal(model.lin.weight, eager.lin.weight)
    ipu_state = opt.state_dict()["ipu_state"]  # PopART's names: Accl1 / Accl2 the moments
    assert ipu_state["Accl1___lin.weight"].dtype == torch.float16
    assert ipu_state["Accl2___lin.weight"].dtype == torch.float32


def test_sgd_velocity_is_float32_for_half_weights():
    p = nn.Parameter(torch.ones(3).half())
    p.grad = torch.ones(3).half()
    opt = OPTIMIZERS["sgd"]([p])
    opt.step()
    assert opt.state[p]["momentum_buffer"].dtype == torch.float32
    assert p.dtype == torch.float16


def test_unsupported_accumulator_types_are_refused():
    with pytest.raises(AssertionError, match="torch.float32 or torch.float16"):
        poptorch.optim.Adam([nn.Parameter(torch.ones(2))], accum_type=torch.bfloat16)
