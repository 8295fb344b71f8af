"""popxl_fx.optim: RMSprop (torch's and TensorFlow's), LAMB, max_grad_norm and Adam without
bias correction as var-update ops, against eager optimizers on the same fed gradients
(parameters and state after K steps, bit for bit), and the eager steps against their formulas.
"""

import pytest
import torch

import popxl_core as popxl
from popxl_core import ops
from popxl_fx import optim_rmsprop
from popxl_fx.optim import OptimizerProgram, UnsupportedOptimizerError
from popxl_fx.optim_groups import state_slots
from popxl_fx.optim_lamb import LAMB
from popxl_fx.optim_replicated import Replication

from .test_fx_train_optim import _grads, _params


def _build(opt, params):
    prog = OptimizerProgram(opt, {p: n for n, p in params.items()})
    ir = popxl.Ir()
    with ir.main_graph:
        vars_ = {n: popxl.variable(p.detach().numpy(), name=n) for n, p in params.items()}
        streams = {n: popxl.h2d_stream(p.shape, popxl.float32, n) for n, p in params.items()}
        prog.build(vars_, {n: ops.host_load(s, n) for n, s in streams.items()})
    return prog, popxl.Session(ir, "cpu"), vars_, streams


def _run(make_sim, ref_step, steps=4):
    """``steps`` steps of the simulated optimizer and of ``ref_step(params, grads)``."""
    sim_params, ref_params = _params(), _params()
    prog, session, vars_, streams = _build(make_sim(list(sim_params.values())), sim_params)
    with session:
        for step in range(steps):
            grads = _grads(step)
            session.run({**prog.feeds(), **{streams[n]: g.numpy() for n, g in grads.items()}})
            for n, p in ref_params.items():
                p.grad = grads[n].clone()
            ref_step(list(ref_params.values()))
        values = session.get_tensors_data([*vars_.values(), *prog.variables()])
    prog.state_to_torch(values)
    sim = {n: torch.from_numpy(values[v]) for n, v in vars_.items()}
    return sim, ref_params, prog.optimizer


def _assert_same(sim, ref):
    for n, p in ref.items():
        assert torch.equal(sim[n], p.detach()), n


def _eager(make):
    made = {}

    def step(params):
        made.setdefault("opt", make(params)).step()

    return step


RMSPROP = [
    {},
    {"centered": True},
    {"momentum": 0.9, "weight_decay": 0.1},
    {"centered": True, "momentum": 0.5, "maximize": True},
]


@pytest.mark.parametrize("kwargs", RMSPROP)
def test_rmsprop_matches_torch(kwargs):
    make = lambda ps: torch.optim.RMSprop(ps, lr=0.01, **kwargs)
    sim, ref, opt = _run(make, _eager(make))
    _assert_same(sim, ref)
    p = next(iter(opt.state))
    assert opt.state[p]["square_avg"].shape == p.shape and float(opt.state[p]["step"]) == 4


@pytest.mark.parametrize("kwargs", [{}, {"momentum": 0.5, "centered": True}])
def test_rmsprop_tf_variant_matches_its_eager_step(kwargs):
    def make(ps):
        return torch.optim.RMSprop([{"params": ps, "use_tf_variant": True}], lr=0.01, **kwargs)

    def ref(params):
        group = {**make(params).param_groups[0]}
        for p in params:
            optim_rmsprop.tf_step(p.data, p.grad, states.setdefault(p, {}), group)

    states = {}
    sim, ref_params, _ = _run(make, ref)
    _assert_same(sim, ref_params)
    torch_sim, _, _ = _run(lambda ps: torch.optim.RMSprop(ps, lr=0.01, **kwargs), lambda _: None)
    assert not torch.equal(sim["a.weight"], torch_sim["a.weight"])


def test_rmsprop_tf_step_is_tensorflows_formula():
    p, g = torch.randn(6), torch.randn(6)
    expected = p - 0.01 * g / torch.sqrt(0.99 + 0.01 * g * g + 1e-8)  # square_avg starts at 1
    group = {"lr": 0.01, "alpha": 0.99, "eps": 1e-8, "weight_decay": 0, "momentum": 0}
    group.update(centered=False, maximize=False)
    optim_rmsprop.tf_step(p, g, {}, group)
    torch.testing.assert_close(p, expected)


@pytest.mark.parametrize(
    "kwargs", [{}, {"bias_correction": False}, {"max_weight_norm": 0.5, "weight_decay": 0.0}]
)
def test_lamb_matches_its_eager_step(kwargs):
    make = lambda ps: LAMB(ps, lr=0.01, **kwargs)
    sim, ref, opt = _run(make, _eager(make))
    _assert_same(sim, ref)
    assert float(opt.state[next(iter(opt.state))]["step"]) == 4


def test_lamb_first_step_is_the_papers_formula():
    p = torch.nn.Parameter(torch.randn(8))
    p.grad = torch.randn(8)
    w = p.detach().clone()
    LAMB([p], lr=0.1, weight_decay=0.01, max_weight_norm=1.0).step()
    upd = p.grad / (p.grad.abs() + 1e-8) + 0.01 * w  # bias-corrected moments: g and g*g
    trust = min(float(w.norm()), 1.0) / float(upd.norm())
    torch.testing.assert_close(p.detach(), w - 0.1 * trust * upd)


@pytest.mark.parametrize("opt", [torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW])
def test_max_grad_norm_clips_as_torch(opt):
    def make(ps):
        return opt([{"params": ps, "max_grad_norm": 0.5}], lr=0.01)

    def ref(params):
        torch.nn.utils.clip_grad_norm_(params, 0.5)
        made.setdefault("opt", opt(params, lr=0.01)).step()

    made = {}
    sim, ref_params, _ = _run(make, ref)
    _assert_same(sim, ref_params)
    unclipped, _, _ = _run(lambda ps: opt(ps, lr=0.01), lambda _: None)
    assert not torch.equal(sim["a.weight"], unclipped["a.weight"])


def test_adamw_without_bias_correction():
    def make(ps):
        return torch.optim.AdamW([{"params": ps, "bias_correction": False}], lr=0.01)

    def ref(params):
        for p in params:
            st = states.setdefault(p, {"m": torch.zeros_like(p), "v": torch.zeros_like(p)})
            p.data.mul_(1 - 0.01 * 0.01)
            st["m"].lerp_(p.grad, 0.1)
            st["v"].mul_(0.999).addcmul_(p.grad, p.grad, value=1 - 0.999)
            p.data.addcdiv_(st["m"], st["v"].sqrt().add_(1e-8), value=-0.01)

    states = {}
    sim, ref_params, _ = _run(make, ref)
    _assert_same(sim, ref_params)


@pytest.mark.parametrize(
    "opt, key, state_key",
    [
        (torch.optim.Adam, "first_order_momentum_accum_type", "exp_avg"),
        (torch.optim.AdamW, "second_order_momentum_accum_type", "exp_avg_sq"),
        (torch.optim.RMSprop, "second_order_momentum_accum_type", "square_avg"),
    ],
)
def test_float16_state_is_rounded_to_half_between_steps(opt, key, state_key):
    def make(ps):
        return opt([{"params": ps, key: torch.float16}], lr=0.01)

    def ref(params):  # float32 arithmetic, the state kept to float16 precision
        made.setdefault("opt", opt(params, lr=0.01)).step()
        for p in params:
            t = made["opt"].state[p][state_key]
            t.copy_(t.half().float())

    made = {}
    sim, ref_params, sim_opt = _run(make, ref)
    _assert_same(sim, ref_params)
    assert all(s[state_key].dtype == torch.float16 for s in sim_opt.state.values())


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda ps: LAMB(ps), "norms of whole weights"),
        (lambda ps: torch.optim.SGD([{"params": ps, "max_grad_norm": 1.0}], lr=0.1), "at once"),
    ],
)
def test_norms_refuse_replicated_tensor_sharding(make, match):
    params = _params()
    prog = OptimizerProgram(
        make(list(params.values())), {p: n for n, p in params.items()}, Replication(2, True)
    )
    with popxl.Ir().main_graph:
        vars_ = {n: popxl.variable(p.detach().numpy(), name=n) for n, p in params.items()}
        with pytest.raises(UnsupportedOptimizerError, match=match):
            prog.build(vars_, dict(vars_))


def test_state_slots_count_each_kinds_weight_sized_state():
    assert state_slots("rmsprop", [{"centered": True, "momentum": 0.9}]) == 3
    assert state_slots("rmsprop", [{"centered": False, "momentum": 0}]) == 1
    assert state_slots("lamb", [{}]) == state_slots("adam", [{}]) == 2
    assert state_slots("sgd", [{"momentum": 0}]) == 0


@pytest.mark.parametrize(
    "extra", [{"bias_correction": False}, {"first_order_momentum_accum_type": torch.float16}]
)
def test_fused_groups_refuse_what_torchs_fused_kernels_lack(extra):
    params = _params()
    opt = torch.optim.AdamW([{"params": list(params.values()), **extra}], fused=True)
    with pytest.raises(UnsupportedOptimizerError, match="fused=True runs torch's fused"):
        OptimizerProgram(opt, {p: n for n, p in params.items()})
