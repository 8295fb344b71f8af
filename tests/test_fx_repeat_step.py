"""A trainer's steps that repeat the last step's program (`popxl_fx.step_repeat`) against an
eager twin put through the same changes between steps, bit for bit (tolerance 0: the
simulator's default numerics are eager's for this MLP and SGD), and the path each step takes:
every change the program cache would see takes the full path."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import popxl_fx
from popxl_fx.step_repeat import RepeatStep

from .fx_train_util import eager_step


@pytest.fixture
def paths(monkeypatch):
    """The path of each step: "repeat" or "full"."""
    taken = []
    run = RepeatStep.run
    full = popxl_fx.Trainer._run_full

    def repeat_run(self, inputs):
        taken.append("repeat")
        return run(self, inputs)

    def full_run(self, *args):
        taken.append("full")
        return full(self, *args)

    monkeypatch.setattr(RepeatStep, "run", repeat_run)
    monkeypatch.setattr(popxl_fx.Trainer, "_run_full", full_run)
    return taken


def _twins():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    twin = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    twin_opt = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    return popxl_fx.training_model(model, opt, F.cross_entropy), model, opt, twin, twin_opt


def _batch(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def _same(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))


def _both(trainer, model, twin, twin_opt, x, y):
    loss = trainer(x, y)
    assert torch.equal(loss, eager_step(twin, twin_opt, x, y))
    assert _same(model, twin)


def test_repeated_steps_match_eager_bit_for_bit(paths):
    trainer, model, _, twin, twin_opt = _twins()
    for seed in range(4):  # new tensors of the same shapes each step
        _both(trainer, model, twin, twin_opt, *_batch(5, seed))
    assert paths == ["full", "repeat", "repeat", "repeat"]


def test_each_change_between_steps_takes_the_full_path(paths):
    trainer, model, opt, twin, twin_opt = _twins()
    x, y = _batch(5, 0)

    def both(*batch):
        _both(trainer, model, twin, twin_opt, *batch)

    both(x, y)
    for g in (*opt.param_groups, *twin_opt.param_groups):  # a hyper-parameter: fed each step
        g["lr"] = 0.05
    both(x, y)
    both(*_batch(7, 1))  # another batch size: another program
    both(x, y)  # back to the first
    both(x.double().float(), y)  # the same shapes again
    assert paths == ["full", "repeat", "full", "full", "repeat"]
    with torch.no_grad():  # new storage: a new structure key (its pointers), shared anew
        w = model[0].weight.detach().clone() * 0.5
        model[0].weight.data = w
        twin[0].weight.data = w.clone()
    both(x, y)
    model[2].bias.requires_grad_(False)  # the structure: another program
    twin[2].bias.requires_grad_(False)
    both(x, y)
    both(x, y)
    model.eval()  # the modes: another signature (no module here acts on it)
    twin.eval()
    both(x, y)
    both(x, y)
    assert paths[5:] == ["full", "full", "repeat", "full", "repeat"]


def test_keyword_inputs_take_the_full_path(paths):
    class Keyword(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 3)

        def forward(self, x, scale=None):
            return (self.fc(x) * scale).sum()

    torch.manual_seed(0)
    model = Keyword()
    trainer = popxl_fx.training_model(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x, _ = _batch(5, 0)
    for _ in range(3):
        trainer(x, scale=torch.ones(5, 3))
    assert paths == ["full", "full", "full"]


@pytest.mark.parametrize(
    "options",
    [
        popxl_fx.Options(replication_factor=2),
        popxl_fx.Options(device_iterations=2),
        popxl_fx.Options(replication_factor=2, device_iterations=2),
    ],
    ids=["replicas", "device_iterations", "both"],
)
def test_replicas_and_device_iterations_repeat_as_the_full_path_runs(paths, options):
    """Feeds laid out per replica and per device iteration: each repeated step equals, to the
    bit, the same step of a trainer kept on the full path."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    full_model = copy.deepcopy(model)

    def make(m):
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        return popxl_fx.training_model(m, opt, F.cross_entropy, options)

    repeated, full = make(model), make(full_model)
    lead = (2,) if options.device_iterations == 2 else ()
    for seed in range(3):
        x, y = _batch(8 * (lead[0] if lead else 1), seed)
        x, y = x.reshape(*lead, 8, 6), y.reshape(*lead, 8)
        full._repeat = None  # the full path every step
        assert torch.equal(repeated(x, y), full(x, y))
        assert _same(model, full_model)
    assert paths == ["full", "full", "repeat", "full", "repeat", "full"]
