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


def _log(capfd) -> str:
    out, err = capfd.readouterr()
    return out + err


def test_subclassed_optimizers_warn_and_run_as_their_base(capfd):
    class MySGD(torch.optim.SGD):
        pass

    model = _Model()
    ipu = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    assert "does not run Python optimizer code" not in _log(capfd)
    ipu.setOptimizer(MySGD(model.parameters(), lr=0.1))
    assert "Optimizer `MySGD` subclassed" in _log(capfd)
    before = model.lin.weight.detach().clone()
    ipu(torch.ones(10))
    assert not torch.equal(before, model.lin.weight)


@pytest.mark.parametrize("relax", [False, True])
def test_attributes_added_after_the_first_use_warn_once(capfd, relax):
    model = _Model()
    opts = poptorch.Options().relaxOptimizerAttributesChecks() if relax else None
    opt = poptorch.optim.SGD(model.parameters(), lr=0.01)
    ipu = poptorch.trainingModel(model, opts, optimizer=opt)
    ipu(torch.ones(10))
    opt.param_groups[0]["initial_lr"] = 0.1
    opt.extra = 1
    for _ in range(2):
        ipu.setOptimizer(opt)
        ipu(torch.ones(10))
    log = _log(capfd)
    n = 0 if relax else 1
    assert log.count("Ignoring unexpected optimizer attribute in SGD optimizer: ['extra']") == n
    assert log.count("Ignoring unexpected group 0 attribute in SGD optimizer") == n


def test_global_arguments_are_attributes_read_by_the_groups():
    model = _Model()
    opt = poptorch.optim.AdamW(model.parameters(), lr=0.01)
    assert opt.loss_scaling == 1.0 and opt.bias_correction is True
    opt.bias_correction = False
    assert opt.param_groups[0]["bias_correction"] is False and "bias_correction" not in vars(opt)
    with pytest.raises(AttributeError):
        _ = opt.velocity_scaling


def test_half_gradient_accumulators_take_the_running_mean():
    model = _Model()
    opts = poptorch.Options()
    opts.Training.setMeanAccumulationAndReplicationReductionStrategy(
        poptorch.MeanReductionStrategy.Post
    )
    opt = poptorch.optim.Adam(model.parameters(), lr=0.01, accum_type=torch.float16)
    ipu = poptorch.trainingModel(model, opts, optimizer=opt)
    ipu.compile(torch.ones(10))
    strategy = ipu.options.Training.meanAccumulationAndReplicationReductionStrategy
    assert strategy == poptorch.MeanReductionStrategy.Running
    post = poptorch.trainingModel(model, opts, optimizer=poptorch.optim.Adam(model.parameters()))
    post.compile(torch.ones(10))
    with pytest.raises(ValueError, match="is already compiled"):
        post.setOptimizer(opt)
    accumulating = poptorch.Options()
    accumulating.Training.gradientAccumulation(2)
    with pytest.raises(poptorch.Error, match="accum_type=torch.float16"):
        poptorch.trainingModel(model, accumulating, optimizer=opt)(torch.ones(2, 10))


def test_state_dict_holds_the_ipu_state_once_compiled():
    model = _Model()
    opt = poptorch.optim.SGD(model.parameters(), lr=0.05, weight_decay=0.5, loss_scaling=0.5)
    ipu = poptorch.trainingModel(model, optimizer=opt)
    assert opt.state_dict()["ipu_state"] is None and opt.state_dict()["ipu_param"] is None
    ipu.compile(torch.ones(10))
    param = opt.state_dict()["ipu_param"]
    assert float(param["scaledLearningRate0___specific___lin.bias"]) == pytest.approx(0.1)
    assert float(param["weightDecayScaleFactor0___specific___lin.weight"]) == pytest.approx(0.975)
    assert float(param["lossScaling_FLOAT"]) == 0.5
    adam = poptorch.optim.Adam(model.parameters(), lr=0.05)
    ipu.setOptimizer(adam)
    ipu.compile(torch.ones(10))
    s0 = adam.state_dict()
    assert float(s0["ipu_param"]["learningRate___specific___lin.weight"]) == pytest.approx(0.05)
    assert torch.equal(s0["ipu_state"]["Accl1___lin.weight"], torch.zeros(10, 10))
    ipu(torch.ones(10))
    s1 = adam.state_dict()
    exp_avg = adam.state[model.lin.weight]["exp_avg"]
    assert torch.equal(s1["ipu_state"]["Accl1___lin.weight"], exp_avg)
    assert float(s1["ipu_state"]["Step___lin.bias"]) == 1


def test_a_loaded_ipu_state_is_what_the_next_step_uses():
    torch.manual_seed(0)
    model, x = _Model(), torch.randn(10)
    eager = copy.deepcopy(model)
    opt = poptorch.optim.Adam(model.parameters(), lr=0.01)
    ipu = poptorch.trainingModel(model, optimizer=opt)
    ipu(x)
    saved = copy.deepcopy(opt.state_dict())
    saved["ipu_state"]["Accl1___lin.weight"] = torch.full((10, 10), 0.5)
    opt.load_state_dict(saved)
    assert opt.state_dict()["ipu_state"] is saved["ipu_state"]  # as loaded, until the call
    eager.load_state_dict(model.state_dict())
    eager_opt = poptorch.optim.Adam(eager.parameters(), lr=0.01)
    eager_opt.load_state_dict(saved)
    eager_opt.state[eager.lin.weight]["exp_avg"] = torch.full((10, 10), 0.5)
    ipu(x)
    eager_opt.zero_grad()
    eager(x)[1].backward()
    eager_opt.step()
    assert torch.equal(model.lin.weight, eager.lin.weight)


def test_loading_state_that_is_not_an_ipu_optimizers_raises():
    model = _Model()
    opt = poptorch.optim.Adam(model.parameters(), lr=0.01)
    with pytest.raises(RuntimeError, match="Only IPU optimizer states"):
        opt.load_state_dict(torch.optim.Adam(model.parameters()).state_dict())
    ipu = poptorch.trainingModel(model, optimizer=opt)
    ipu(torch.ones(10))
    state = opt.state_dict()
    state["ipu_param"]["learningRate___specific___lin.bias"] = torch.tensor(3.0)
    opt.load_state_dict(state)
    with pytest.raises(poptorch.Error, match="learningRate___specific___lin.bias"):
        ipu(torch.ones(10))


def test_arguments_given_to_the_constructor_are_variable():
    params = _Model().parameters()
    given = poptorch.optim.SGD(params, lr=1.0, momentum=0.0, loss_scaling=1.0)
    assert not given.variable_attrs.isConstant("momentum")
    assert not given.variable_attrs.isConstant("loss_scaling")
    default = poptorch.optim.RMSprop(_Model().parameters(), lr=1.0)
    assert default.variable_attrs.isConstant("alpha")
    assert not default.variable_attrs.isConstant("lr")
    default.variable_attrs.markAsVariable("alpha")
    assert not default.variable_attrs.isConstant("alpha")


def test_copies_keep_poptorchs_attributes():
    opt = poptorch.optim.AdamW(_Model().parameters(), lr=0.01, loss_scaling=2.0)
    opt.variable_attrs.markAsVariable("eps")
    copied = copy.copy(opt)
    assert copied.loss_scaling == 2.0 and not copied.variable_attrs.isConstant("eps")
    assert copied.state_dict()["ipu_state"] is None
