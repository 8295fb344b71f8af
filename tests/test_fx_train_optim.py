"""popxl_fx.optim: torch optimizers as var-update ops, against torch.optim on the same gradients.

Gradients are fed from the host, so these tests need no tracing. SGD, Adam and AdamW must match
torch's single-tensor (CPU default) implementation bit for bit after K steps: parameters and
optimizer state, rtol=0, atol=0.
"""

import numpy as np
import pytest
import torch

import popxl_core as popxl
from popxl_core import ops
from popxl_fx.optim import OptimizerProgram, UnsupportedOptimizerError

SHAPES = {"a.weight": (5, 7), "a.bias": (7,), "b.weight": (33,)}


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {n: torch.nn.Parameter(torch.randn(s, generator=g)) for n, s in SHAPES.items()}


def _grads(step):
    g = torch.Generator().manual_seed(100 + step)
    return {n: torch.randn(s, generator=g) for n, s in SHAPES.items()}


def _build(opt, params):
    prog = OptimizerProgram(opt, {p: n for n, p in params.items()})
    ir = popxl.Ir()
    with ir.main_graph:
        vars_ = {n: popxl.variable(p.detach().numpy(), name=n) for n, p in params.items()}
        streams = {
            n: popxl.h2d_stream(p.shape, popxl.float32, f"grad.{n}") for n, p in params.items()
        }
        grads = {n: ops.host_load(s, f"grad.{n}") for n, s in streams.items()}
        prog.build(vars_, grads)
    return prog, popxl.Session(ir, "cpu"), vars_, streams


def _run(make_opt, steps=3, scheduler=None):
    """Steps the simulated and the torch optimizer on the same gradients."""
    sim_params, ref_params = _params(), _params()
    sim_opt, ref_opt = make_opt(list(sim_params.values())), make_opt(list(ref_params.values()))
    prog, session, vars_, streams = _build(sim_opt, sim_params)
    sched = [scheduler(o) for o in (sim_opt, ref_opt)] if scheduler else []
    with session:
        for step in range(steps):
            grads = _grads(step)
            session.run({**prog.feeds(), **{streams[n]: g.numpy() for n, g in grads.items()}})
            for n, p in ref_params.items():
                p.grad = grads[n].clone()
            ref_opt.step()
            for s in sched:
                s.step()
        values = session.get_tensors_data([*vars_.values(), *prog.variables()])
    prog.state_to_torch(values)
    sim = {n: torch.from_numpy(values[v]) for n, v in vars_.items()}
    return sim, ref_params, sim_opt, ref_opt


def assert_steps_bitwise(make_opt, steps=5):
    """``steps`` of the simulated and the torch optimizer: parameters and state equal to the bit."""
    sim, ref, sim_opt, ref_opt = _run(make_opt, steps=steps)
    for n, p in ref.items():
        torch.testing.assert_close(sim[n], p.detach(), rtol=0, atol=0, msg=n)
    _assert_state(sim_opt, ref_opt, 0.0)


def _assert_state(sim_opt, ref_opt, rtol):
    sim_sd, ref_sd = sim_opt.state_dict(), ref_opt.state_dict()
    assert sim_sd["state"].keys() == ref_sd["state"].keys()
    for i, ref_state in ref_sd["state"].items():
        assert sim_sd["state"][i].keys() == ref_state.keys()
        for key, ref in ref_state.items():
            assert sim_sd["state"][i][key].dtype == ref.dtype, key
            torch.testing.assert_close(sim_sd["state"][i][key], ref, rtol=rtol, atol=0)


CASES = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1),
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    "sgd_all": lambda ps: torch.optim.SGD(
        ps, lr=0.1, momentum=0.8, dampening=0.25, weight_decay=1e-2
    ),
    "sgd_nesterov": lambda ps: torch.optim.SGD(
        ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3
    ),
    "sgd_maximize": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.5, maximize=True),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
    "adamw_small_beta1": lambda ps: torch.optim.AdamW(ps, lr=1e-2, betas=(0.3, 0.99)),
    "adamw_maximize": lambda ps: torch.optim.AdamW(ps, lr=1e-3, eps=1e-6, maximize=True),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2),
    "adam_l2": lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.1, eps=1e-6),
    "groups": lambda ps: torch.optim.AdamW(
        [{"params": ps[:2], "lr": 3e-2}, {"params": ps[2:], "weight_decay": 0.0}], lr=1e-3
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_torch_optimizer(case):
    assert_steps_bitwise(CASES[case])


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step()`")  # sim_opt.step
@pytest.mark.parametrize("case", ["sgd_momentum", "adamw"])
def test_lr_scheduler_changes_fed_lr(case):
    sim, ref, _, _ = _run(
        CASES[case], steps=4, scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, 1, gamma=0.5)
    )
    for n, p in ref.items():
        torch.testing.assert_close(sim[n], p.detach(), rtol=0, atol=0, msg=n)


def test_resumes_from_torch_state():
    """State already in the torch optimizer (a loaded checkpoint) seeds the variables."""
    params = _params()
    opt = torch.optim.SGD(list(params.values()), lr=0.1, momentum=0.9)
    for p in params.values():
        p.grad = torch.ones_like(p)
    opt.step()
    prog, *_ = _build(opt, params)
    assert prog.groups[0].step == 1  # the next step uses the momentum, not a gradient copy
    assert prog.feeds()[prog.groups[0].streams["buf_scale"]] == np.float32(0.9)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"amsgrad": True}, r"amsgrad=True .*use amsgrad=False \(or fused=True\)"),
        ({"capturable": True}, "capturable=True"),
    ],
)
def test_unsupported_options_raise(kwargs, match):
    params = _params()
    opt = torch.optim.Adam(list(params.values()), **kwargs)
    with pytest.raises(UnsupportedOptimizerError, match=match):
        OptimizerProgram(opt, {p: n for n, p in params.items()})


def test_unsupported_optimizer_and_foreign_params_raise():
    params = _params()
    with pytest.raises(UnsupportedOptimizerError, match="Adagrad is not supported"):
        OptimizerProgram(torch.optim.Adagrad(list(params.values())), {})
    opt = torch.optim.SGD([*params.values(), torch.nn.Parameter(torch.zeros(2, 2))], lr=0.1)
    with pytest.raises(UnsupportedOptimizerError, match=r"not parameters of the model.*\(2, 2\)"):
        OptimizerProgram(opt, {p: n for n, p in params.items()})


def _set(**values):
    def change(o):
        for pg in o.param_groups:
            pg.update(values)

    return change


@pytest.mark.parametrize(
    "case, change",
    [("sgd_all", _set(momentum=0.5, dampening=0.0, lr=0.02)), ("adam_l2", _set(betas=(0.5, 0.9)))],
)
def test_hyper_parameters_changed_between_steps_are_fed(case, change):
    # feeds() keeps the arrays of the last step while nothing they come from changed
    class Change:
        def __init__(self, opt):
            self.opt, self.n = opt, 0

        def step(self):
            self.n += 1
            if self.n == 2:
                change(self.opt)

    sim, ref, sim_opt, ref_opt = _run(CASES[case], steps=4, scheduler=Change)
    assert sim_opt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"]
    for n, p in ref.items():
        torch.testing.assert_close(sim[n], p.detach(), rtol=0, atol=0, msg=n)


@pytest.mark.parametrize("option", [{"momentum": 0.0}, {"weight_decay": 0.1}, {"nesterov": True}])
def test_a_structural_option_changed_after_building_raises(option):
    params = _params()
    opt = torch.optim.SGD(list(params.values()), lr=0.1, momentum=0.9)
    prog, *_ = _build(opt, params)
    prog.feeds()
    opt.param_groups[0].update(option)
    with pytest.raises(UnsupportedOptimizerError, match="changed an option the program was built"):
        prog.feeds()
