"""``torch.optim.SGD/Adam/AdamW(..., fused=True)`` in training_model, against eager torch.

Each case trains a small MLP for a few steps on the simulator and an eager copy with the same
fused optimizer: losses, parameters and optimizer state must be equal to the bit (rtol=atol=0,
same dtypes), since the simulator calls torch's own fused kernels on the same values (the
gradients are eager's bit for bit: linear layers, GELU and cross-entropy run eager's kernels).
The compiled step makes one fused kernel call per param group, as torch does.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

import popxl_fx
from popxl_fx.optim import OptimizerProgram, UnsupportedOptimizerError

from .test_fx_train_optim import assert_steps_bitwise

CASES = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.05, fused=True),
    "sgd_momentum_all": lambda ps: torch.optim.SGD(
        ps, lr=0.0123, momentum=0.8, dampening=0.25, weight_decay=1e-2, fused=True
    ),
    "sgd_nesterov_maximize": lambda ps: torch.optim.SGD(
        ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3, maximize=True, fused=True
    ),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2, fused=True),
    "adam_l2_maximize": lambda ps: torch.optim.Adam(
        ps, lr=3e-3, betas=(0.3, 0.99), weight_decay=0.1, eps=1e-6, maximize=True, fused=True
    ),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, fused=True),
    "adamw_amsgrad": lambda ps: torch.optim.AdamW(ps, lr=7e-3, amsgrad=True, fused=True),
    "adam_capturable": lambda ps: torch.optim.Adam(ps, lr=1e-2, capturable=True, fused=True),
    "adam_tensor_lr": lambda ps: torch.optim.Adam(ps, lr=torch.tensor(0.0123), fused=True),
}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(20, 24), nn.GELU(), nn.Linear(24, 24), nn.GELU(), nn.Linear(24, 5)
    )


def _batches(n: int):
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(6, 20, generator=g), torch.randint(0, 5, (6,), generator=g)) for _ in range(n)
    ]


def _eager_step(model, opt, x, y) -> torch.Tensor:
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.detach()


def _bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def _assert_same(sim_model, sim_opt, ref_model, ref_opt) -> None:
    sim_sd, ref_sd = sim_model.state_dict(), ref_model.state_dict()
    for k in ref_sd:
        assert _bits(sim_sd[k], ref_sd[k]), f"parameter {k} differs"
    sim_st, ref_st = sim_opt.state_dict()["state"], ref_opt.state_dict()["state"]
    assert sim_st.keys() == ref_st.keys()
    for i in ref_st:
        assert list(sim_st[i]) == list(ref_st[i]), (i, list(sim_st[i]), list(ref_st[i]))
        for key in ref_st[i]:
            assert _bits(sim_st[i][key], ref_st[i][key]), f"state {i}.{key} differs"


def _train(make_opt, steps=4, scheduler=None):
    """The trainer and an eager twin, each with ``make_opt``; losses of both per step."""
    sim_model, ref_model = _model(), _model()
    sim_opt, ref_opt = make_opt(sim_model.parameters()), make_opt(ref_model.parameters())
    scheds = [scheduler(o) for o in (sim_opt, ref_opt)] if scheduler else []
    trainer = popxl_fx.training_model(sim_model, sim_opt, nn.CrossEntropyLoss())
    for x, y in _batches(steps):
        loss = trainer(x, y)
        ref = _eager_step(ref_model, ref_opt, x, y)
        assert _bits(loss, ref), (loss.item(), ref.item())
        for s in scheds:
            s.step()
    return trainer, (sim_model, sim_opt, ref_model, ref_opt)


def _fused_calls(trainer) -> int:
    """Kernel calls of the fused ops in the compiled step (a group binds one kernel)."""
    ops = trainer.session._program.kernel_ops.values()
    return sum(op.type in ("FusedSGD", "FusedAdam", "FusedAdamW") for op in ops)


@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_optimizer_matches_eager_bitwise(case):
    trainer, models = _train(CASES[case])
    _assert_same(*models)
    assert _fused_calls(trainer) == 1  # six parameters, one call, as torch.optim does
    assert trainer.report().summary()  # the fused ops have a cost


@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_optimizer_on_host_gradients(case):
    """Odd shapes (a 33-element tail past the vectorised part) through OptimizerProgram."""
    assert_steps_bitwise(CASES[case])


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step()`")
@pytest.mark.parametrize("case", ["sgd_momentum_all", "adamw", "adam_l2_maximize"])
def test_lr_scheduler_changes_fed_lr_without_recompiling(case):
    sched = lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda k: 0.7**k)
    trainer, models = _train(CASES[case], steps=4, scheduler=sched)
    _assert_same(*models)
    assert len(trainer._programs) == 1


def _adam_differs_with_float32_lr(lr: float) -> bool:
    """Whether torch's fused Adam step gives other bits for ``lr`` rounded to float32."""
    outs = []
    for value in (lr, float(np.float32(lr))):
        g = torch.Generator().manual_seed(3)
        p, grad = torch.randn(64, generator=g), torch.randn(64, generator=g)
        m, v, step = torch.zeros(64), torch.zeros(64), torch.tensor(1.0)
        torch._fused_adam_(
            [p],
            [grad],
            [m],
            [v],
            [],
            [step],
            amsgrad=False,
            lr=value,
            beta1=0.9,
            beta2=0.999,
            weight_decay=0.0,
            eps=1e-8,
            maximize=False,
        )
        outs.append(p)
    return not torch.equal(*outs)


def test_lr_is_fed_in_double_precision():
    """The kernel divides ``lr`` by the bias correction in double: a float32 feed would be
    off in the last bit for this lr (checked here), the double feed is exact."""
    lr = next(x for x in np.linspace(1e-3, 2e-3, 101) if _adam_differs_with_float32_lr(x))
    _, models = _train(lambda ps: torch.optim.Adam(ps, lr=float(lr), fused=True), steps=2)
    _assert_same(*models)


def test_two_param_groups_one_call_each_and_a_non_fused_group():
    def groups(ps):
        ps = list(ps)
        return torch.optim.AdamW(
            [
                {"params": ps[:2], "lr": 3e-2},
                {"params": ps[2:4], "weight_decay": 0.0},
                {"params": ps[4:], "fused": False},
            ],
            lr=1e-3,
            fused=True,
        )

    trainer, models = _train(groups)
    _assert_same(*models)
    assert _fused_calls(trainer) == 2


@pytest.mark.parametrize("case", ["sgd_momentum_all", "adamw_amsgrad"])
def test_state_dict_round_trip(case):
    """Eager state continues on the simulator, and the simulator's on eager, bit for bit."""
    make = CASES[case]
    batches = _batches(6)
    ref_model = _model()
    ref_opt = make(ref_model.parameters())
    for x, y in batches[:2]:
        _eager_step(ref_model, ref_opt, x, y)
    sim_model = _model()
    sim_opt = make(sim_model.parameters())
    sim_model.load_state_dict(ref_model.state_dict())
    sim_opt.load_state_dict(copy.deepcopy(ref_opt.state_dict()))
    trainer = popxl_fx.training_model(sim_model, sim_opt, nn.CrossEntropyLoss())
    for x, y in batches[2:4]:
        assert _bits(trainer(x, y), _eager_step(ref_model, ref_opt, x, y))
    _assert_same(sim_model, sim_opt, ref_model, ref_opt)
    back_model = _model()
    back_opt = make(back_model.parameters())
    back_model.load_state_dict(sim_model.state_dict())
    back_opt.load_state_dict(copy.deepcopy(sim_opt.state_dict()))
    for x, y in batches[4:]:
        assert _bits(_eager_step(back_model, back_opt, x, y), _eager_step(ref_model, ref_opt, x, y))
    _assert_same(back_model, back_opt, ref_model, ref_opt)


@pytest.mark.parametrize("case", ["sgd_momentum_all", "adam"])
def test_recompiling_for_a_new_batch_size_keeps_the_state(case):
    """A new input shape builds a second program; the state moves through torch's."""
    sim_model, ref_model = _model(), _model()
    sim_opt, ref_opt = CASES[case](sim_model.parameters()), CASES[case](ref_model.parameters())
    trainer = popxl_fx.training_model(sim_model, sim_opt, nn.CrossEntropyLoss())
    batches = _batches(4)
    batches[2:] = [(x[:4], y[:4]) for x, y in batches[2:]]
    for x, y in batches:
        assert _bits(trainer(x, y), _eager_step(ref_model, ref_opt, x, y))
    assert len(trainer._programs) == 2
    _assert_same(sim_model, sim_opt, ref_model, ref_opt)


def test_non_fused_amsgrad_names_the_fused_alternative():
    model = _model()
    with pytest.raises(UnsupportedOptimizerError, match=r"amsgrad=True .*\(or fused=True\)"):
        popxl_fx.training_model(
            model, torch.optim.Adam(model.parameters(), amsgrad=True), nn.CrossEntropyLoss()
        )


def test_fused_with_grad_scale_raises():
    model = _model()
    opt = torch.optim.Adam(model.parameters(), fused=True)
    opt.grad_scale = torch.tensor(1024.0)  # what torch.amp.GradScaler sets around step()
    with pytest.raises(UnsupportedOptimizerError, match="fused=True with a grad_scale"):
        OptimizerProgram(opt, {p: n for n, p in model.named_parameters()})


@pytest.mark.parametrize(("option", "fused"), [("fused", True), ("nesterov", False)])
def test_switching_an_option_after_build_recompiles_to_eager(option, fused, caplog):
    """A structural option changed between steps (fused off, nesterov on) builds the program
    for it (issue 17: logged), and the steps stay eager's, bit for bit."""
    sim_model, ref_model = _model(), _model()
    sim_opt, ref_opt = (
        torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, fused=fused)
        for m in (sim_model, ref_model)
    )
    trainer = popxl_fx.training_model(sim_model, sim_opt, nn.CrossEntropyLoss())
    batches = _batches(3)
    assert _bits(trainer(*batches[0]), _eager_step(ref_model, ref_opt, *batches[0]))
    for opt in (sim_opt, ref_opt):
        opt.param_groups[0][option] = not opt.param_groups[0][option]
    with caplog.at_level("INFO", logger="popxl_fx"):
        for x, y in batches[1:]:
            assert _bits(trainer(x, y), _eager_step(ref_model, ref_opt, x, y))
    assert "optimizer param group 0 changed" in caplog.text
    assert len(trainer._programs) == 2
    _assert_same(sim_model, sim_opt, ref_model, ref_opt)
