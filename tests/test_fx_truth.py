"""Issue 17: one source of truth. A trainer's weights and optimizer state are the torch
model's and optimizer's own tensors, so whatever the user does to them between steps (writes,
load_state_dict, add_param_group, requires_grad_, a second trainer) gives eager's numbers
over the next steps, bit for bit (the same torch kernels on the same values), or raises naming
the change."""

from __future__ import annotations

import copy
import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from popxl_fx import inference_model, training_model
from popxl_fx.optim import UnsupportedOptimizerError
from popxl_fx.torch_state import SharedState

from .fx_train_util import eager_step

OPTIMIZERS = {
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=0.01),
}


@pytest.fixture(params=["shared", "copied"], autouse=True)
def storage(request, monkeypatch):
    """Each test with the torch tensors shared, and again with every one copied (the path of
    tensors that cannot be shared: another dtype, or a Session with replicas)."""
    if request.param == "copied":
        monkeypatch.setattr(SharedState, "_can_share", lambda self, v, t: False)
    return request.param


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def batches(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(5, 4, generator=g), torch.randint(0, 3, (5,), generator=g)) for _ in range(n)
    ]


def twins(name):
    """The simulated side (model, optimizer, trainer) and the eager side (model, optimizer)."""
    sim, ref = mlp(), mlp()
    sim_opt, ref_opt = OPTIMIZERS[name](sim.parameters()), OPTIMIZERS[name](ref.parameters())
    return sim, sim_opt, training_model(sim, sim_opt, F.cross_entropy), ref, ref_opt


def assert_steps_equal(trainer, ref, ref_opt, data):
    for i, (x, y) in enumerate(data):
        got, want = trainer(x, y), eager_step(ref, ref_opt, x, y)
        assert torch.equal(got, want), (i, got, want)  # exact: same kernels, same values


def assert_same_state(sim, sim_opt, ref, ref_opt):
    for (n, a), b in zip(sim.state_dict().items(), ref.state_dict().values()):
        assert torch.equal(a, b), n
    for p, q in zip(sim.parameters(), ref.parameters()):
        a, b = sim_opt.state.get(p, {}), ref_opt.state.get(q, {})
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_torch_holds_the_trained_values_after_each_step_without_a_copy(name, storage):
    sim, sim_opt, trainer, ref, ref_opt = twins(name)
    weight = sim[0].weight
    pointer = weight.data_ptr()
    shared = storage == "shared"
    for x, y in batches(3):
        assert_steps_equal(trainer, ref, ref_opt, [(x, y)])
        assert torch.equal(sim[0].weight, ref[0].weight)  # no state_dict() or sync needed
    assert weight.data_ptr() == pointer and sim[0].weight is weight
    x = batches(1, seed=5)[0][0]
    assert torch.equal(sim(x), ref(x)) and torch.equal(trainer.model(x), ref(x))
    state = sim_opt.state[weight]
    key = "exp_avg" if name == "adam" else "momentum_buffer"
    held = state[key]
    trainer(*batches(1, seed=6)[0])
    assert sim_opt.state[weight][key] is held  # updated in place, as eager's step does
    variable = trainer._active.weights.variables["0.weight"]
    assert np.array_equal(trainer.session.get_tensor_data(variable), weight.detach().numpy())
    device = trainer.session._device[0][trainer.session._variable_index[variable]]
    assert (device.data_ptr() == pointer) == shared  # the device value is the torch tensor
    assert torch.equal(inference_model(sim)(x), sim(x))  # a later program sees them too


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_user_writes_between_steps_are_used(name):
    sim, sim_opt, trainer, ref, ref_opt = twins(name)
    data = batches(4)
    assert_steps_equal(trainer, ref, ref_opt, data[:2])
    for model in (sim, ref):
        with torch.no_grad():
            model[0].weight.mul_(0.5)  # pruning/EMA-style in-place code
            model[2].bias.zero_()
    assert_steps_equal(trainer, ref, ref_opt, data[2:])
    assert_same_state(sim, sim_opt, ref, ref_opt)


def test_replaced_storage_is_used():
    sim, sim_opt, trainer, ref, ref_opt = twins("sgd_momentum")
    data = batches(3)
    assert_steps_equal(trainer, ref, ref_opt, data[:1])
    for model in (sim, ref):
        model[0].weight.data = torch.full_like(model[0].weight, 0.01)  # new storage
    assert_steps_equal(trainer, ref, ref_opt, data[1:])
    assert_same_state(sim, sim_opt, ref, ref_opt)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_load_state_dict_of_model_and_optimizer_between_steps(name):
    sim, sim_opt, trainer, ref, ref_opt = twins(name)
    data = batches(6)
    assert_steps_equal(trainer, ref, ref_opt, data[:2])
    saved = [copy.deepcopy(o.state_dict()) for o in (sim, sim_opt, ref, ref_opt)]
    assert_steps_equal(trainer, ref, ref_opt, data[2:4])
    for obj, state in zip((sim, sim_opt, ref, ref_opt), saved):
        obj.load_state_dict(state)  # roll back two steps
    assert_steps_equal(trainer, ref, ref_opt, data[4:])
    assert_same_state(sim, sim_opt, ref, ref_opt)


def test_a_fresh_optimizer_state_restarts_like_eager():
    sim, sim_opt, trainer, ref, ref_opt = twins("adam")
    data = batches(4)
    assert_steps_equal(trainer, ref, ref_opt, data[:2])
    for opt in (sim_opt, ref_opt):
        opt.state.clear()  # Adam's bias correction starts again from step 1
    assert_steps_equal(trainer, ref, ref_opt, data[2:])
    assert_same_state(sim, sim_opt, ref, ref_opt)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_add_param_group_between_steps(name, caplog):
    sim, ref = mlp(), mlp()
    sim_opt, ref_opt = (OPTIMIZERS[name](m[0].parameters()) for m in (sim, ref))
    trainer = training_model(sim, sim_opt, F.cross_entropy)
    data = batches(4)
    assert_steps_equal(trainer, ref, ref_opt, data[:2])  # the head is not optimised yet
    for m, opt in ((sim, sim_opt), (ref, ref_opt)):
        opt.add_param_group({"params": list(m[2].parameters()), "lr": 0.05})
    with caplog.at_level(logging.INFO, logger="popxl_fx"):
        assert_steps_equal(trainer, ref, ref_opt, data[2:])
    assert "optimizer param group 1 was added" in caplog.text
    assert_same_state(sim, sim_opt, ref, ref_opt)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_requires_grad_false_between_steps(name, caplog):
    sim, sim_opt, trainer, ref, ref_opt = twins(name)
    data = batches(5)
    assert_steps_equal(trainer, ref, ref_opt, data[:2])
    for m in (sim, ref):
        m[0].requires_grad_(False)  # freeze the first layer
    with caplog.at_level(logging.INFO, logger="popxl_fx"):
        assert_steps_equal(trainer, ref, ref_opt, data[2:])
    assert "parameter '0.weight' has requires_grad=False" in caplog.text
    assert_same_state(sim, sim_opt, ref, ref_opt)


def test_replaced_submodule_raises_naming_the_change():
    sim, sim_opt, trainer, _, _ = twins("sgd_momentum")
    x, y = batches(1)[0]
    trainer(x, y)
    torch.manual_seed(3)
    sim[2] = nn.Linear(8, 3)  # the optimizer still holds the old head's parameters
    with pytest.raises(UnsupportedOptimizerError, match=r"module '2' was replaced.*new optimizer"):
        trainer(x, y)


def test_replaced_submodule_with_a_new_optimizer_and_a_second_trainer():
    sim, sim_opt, trainer, ref, ref_opt = twins("adam")
    data = batches(5)
    assert_steps_equal(trainer, ref, ref_opt, data[:2])
    for m in (sim, ref):
        torch.manual_seed(3)
        m[2] = nn.Linear(8, 3)
    sim_opt2, ref_opt2 = (torch.optim.SGD(m.parameters(), lr=0.05) for m in (sim, ref))
    second = training_model(sim, sim_opt2, F.cross_entropy)
    assert_steps_equal(second, ref, ref_opt2, data[2:])
    assert_same_state(sim, sim_opt2, ref, ref_opt2)


def test_two_trainers_on_one_model_take_turns_like_eager():
    sim, ref = mlp(), mlp()
    sim_sgd, ref_sgd = (OPTIMIZERS["sgd_momentum"](m.parameters()) for m in (sim, ref))
    sim_adam, ref_adam = (OPTIMIZERS["adam"](m.parameters()) for m in (sim, ref))
    first = training_model(sim, sim_sgd, F.cross_entropy)
    second = training_model(sim, sim_adam, F.cross_entropy)
    for i, (x, y) in enumerate(batches(6)):
        trainer, opt = (first, ref_sgd) if i % 2 == 0 else (second, ref_adam)
        assert torch.equal(trainer(x, y), eager_step(ref, opt, x, y)), i
    assert_same_state(sim, sim_sgd, ref, ref_sgd)
    assert_same_state(sim, sim_adam, ref, ref_adam)


def test_eval_between_training_steps_sees_the_current_weights():
    sim, sim_opt, trainer, ref, ref_opt = twins("sgd_momentum")
    data = batches(4)
    x_val = batches(1, seed=9)[0][0]
    for x, y in data:
        assert_steps_equal(trainer, ref, ref_opt, [(x, y)])
        with torch.no_grad():
            assert torch.equal(sim.eval()(x_val), ref.eval()(x_val))
        sim.train(), ref.train()


def test_dtype_change_after_steps_logs_and_refuses_the_stale_state(caplog):
    """model.double() after the optimizer stepped: eager keeps the momentum in float32 op by
    op, which a program cannot reproduce; the trainer says so, naming the tensor."""
    sim, sim_opt, trainer, _, _ = twins("sgd_momentum")
    x, y = batches(1)[0]
    trainer(x, y)
    sim.double()
    with (
        caplog.at_level(logging.INFO, logger="popxl_fx"),
        pytest.raises(
            UnsupportedOptimizerError, match=r"'momentum_buffer' of parameter '0.weight'"
        ),
    ):
        trainer(x.double(), y)
    assert "parameter '0.weight' changed from True, torch.float32" in caplog.text


def test_an_inference_model_made_before_training_follows_the_steps():
    sim, sim_opt, trainer, ref, ref_opt = twins("adam")
    infer = inference_model(sim.eval())
    x_val = batches(1, seed=9)[0][0]
    assert torch.equal(infer(x_val), ref.eval()(x_val))
    for x, y in batches(3):
        sim.train(), ref.train()
        assert_steps_equal(trainer, ref, ref_opt, [(x, y)])
        sim.eval(), ref.eval()
        with torch.no_grad():
            assert torch.equal(infer(x_val), ref(x_val))
