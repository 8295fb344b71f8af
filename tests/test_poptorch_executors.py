"""popxl_fx.poptorch: PopTorch's executors on popxl_fx, compared with eager torch bit for bit
(tolerance 0) and, for the looped steps, with popxl_fx.training_model itself (the layer is
thin: it must give popxl_fx's numbers)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import popxl_fx
import popxl_fx.poptorch as poptorch


class Net(nn.Module):
    """A PopTorch-style model: returns (output, loss) with a torch loss."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x, target=None):
        out = self.fc(x)
        return out if target is None else (out, self.loss(out, target))


class LossOnly(Net):
    def forward(self, x, target):
        return self.loss(self.fc(x), target)


def _data(rows: int = 8):
    g = torch.Generator().manual_seed(1)
    return torch.randn(rows, 4, generator=g), torch.randint(0, 3, (rows,), generator=g)


def _eager_step(model, opt, x, t):
    out, loss = model(x, t)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return out.detach(), loss.detach()


@pytest.mark.parametrize(
    "make",
    [
        (
            lambda p: poptorch.optim.SGD(p, lr=0.1, momentum=0.9),
            lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        ),
        (lambda p: poptorch.optim.Adam(p, lr=0.01), lambda p: torch.optim.Adam(p, lr=0.01)),
        (lambda p: poptorch.optim.AdamW(p, lr=0.01), lambda p: torch.optim.AdamW(p, lr=0.01)),
    ],
    ids=["SGD", "Adam", "AdamW"],
)
def test_training_matches_eager(make):
    torch.manual_seed(0)
    model = Net()
    twin = copy.deepcopy(model)
    ipu = poptorch.trainingModel(model, poptorch.Options(), make[0](model.parameters()))
    opt = make[1](twin.parameters())
    x, t = _data()
    for _ in range(3):
        out, loss = ipu(x, t)
        ref_out, ref_loss = _eager_step(twin, opt, x, t)
        assert torch.equal(out, ref_out) and torch.equal(loss, ref_loss)
    assert torch.equal(model.fc.weight, twin.fc.weight)  # implicit weight sync


def test_identity_loss_and_default_optimizer():
    torch.manual_seed(0)

    class Custom(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            y = self.fc(x)
            return poptorch.identity_loss((y**2).sum(1), reduction="mean"), y

    model = Custom()
    twin = copy.deepcopy(model)
    ipu = poptorch.trainingModel(model)  # PopTorch's default: SGD, lr=0.01
    opt = torch.optim.SGD(twin.parameters(), lr=0.01)
    x, _ = _data()
    loss, y = ipu(x)
    ref_loss, ref_y = twin(x)
    opt.zero_grad()
    ref_loss.backward()
    opt.step()
    assert torch.equal(loss, ref_loss.detach()) and torch.equal(y, ref_y.detach())
    assert torch.equal(model.fc.weight, twin.fc.weight)


def test_inference_output_modes():
    torch.manual_seed(0)
    model = Net().eval()
    x, _ = _data(12)
    with torch.no_grad():  # each device iteration's forward runs on its own 4 rows
        ref = torch.cat([model(part) for part in x.split(4)])
    cases = {
        poptorch.OutputMode.All: ref,
        poptorch.OutputMode.Final: ref[8:],
        poptorch.OutputMode.Sum: ref.reshape(3, 4, 3).sum(0),
    }
    for mode, want in cases.items():
        opts = poptorch.Options().deviceIterations(3).outputMode(mode)
        got = poptorch.inferenceModel(model, opts)(x)
        assert torch.equal(got, want), mode
    opts = poptorch.Options().deviceIterations(3).outputMode(poptorch.OutputMode.EveryN, 2)
    assert torch.equal(poptorch.inferenceModel(model, opts)(x), ref[4:8])


@pytest.mark.parametrize("accum,iterations", [(2, 1), (1, 2), (2, 2)])
def test_looped_training_is_popxl_fx(accum, iterations):
    """The combined batch reaches popxl_fx as its own loops take it: same losses, weights."""
    torch.manual_seed(0)
    model = LossOnly()
    twin = copy.deepcopy(model)
    opts = poptorch.Options().deviceIterations(iterations)
    opts.Training.gradientAccumulation(accum)
    opts.outputMode(poptorch.OutputMode.All)
    ipu = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.1))
    fx = popxl_fx.training_model(
        twin,
        torch.optim.SGD(twin.parameters(), lr=0.1),
        options=popxl_fx.Options(gradient_accumulation=accum, device_iterations=iterations),
    )
    x, t = _data(8 * accum * iterations)
    loss = ipu(x, t)  # PopTorch's All: every micro-batch's loss
    assert loss.shape == ((accum * iterations,) if accum * iterations > 1 else ())
    shape = (iterations, -1) if iterations > 1 else (-1,)
    want = fx(x.reshape(*shape, 4), t.reshape(*shape))  # per step: the micro-batches' mean
    got = loss.reshape(iterations, accum)
    mean = sum(got.unbind(1), torch.zeros(iterations)) / accum  # as the loop adds them
    assert torch.equal(mean.reshape(want.shape), want)
    assert torch.equal(model.fc.weight, twin.fc.weight)


@pytest.mark.parametrize("mode", ["All", "Final"])
def test_device_iterations_return_every_output(mode):
    """Training with 3 device iterations: each iteration's output and loss, as 3 eager steps."""
    torch.manual_seed(0)
    model = Net()
    twin = copy.deepcopy(model)
    opts = poptorch.Options().deviceIterations(3).outputMode(getattr(poptorch.OutputMode, mode))
    ipu = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.1))
    opt = torch.optim.SGD(twin.parameters(), lr=0.1)
    x, t = _data(12)
    out, loss = ipu(x, t)
    steps = [_eager_step(twin, opt, xs, ts) for xs, ts in zip(x.split(4), t.split(4))]
    if mode == "All":
        assert torch.equal(out, torch.cat([o for o, _ in steps]))
        assert torch.equal(loss, torch.stack([lo for _, lo in steps]))
    else:
        assert torch.equal(out, steps[-1][0]) and torch.equal(loss, steps[-1][1])
    assert torch.equal(model.fc.weight, twin.fc.weight)


def test_training_and_inference_share_weights():
    torch.manual_seed(0)
    model = Net()
    train = poptorch.trainingModel(model, optimizer=poptorch.optim.SGD(model.parameters(), lr=1))
    infer = poptorch.inferenceModel(model)
    x, t = _data()
    before = infer(x)
    train(x, t)
    after = infer(x)
    assert not torch.equal(before, after)
    assert torch.equal(after, model(x))


def test_set_optimizer_and_lr_changes():
    torch.manual_seed(0)
    model = Net()
    twin = copy.deepcopy(model)
    opt = poptorch.optim.SGD(model.parameters(), lr=0.1)
    ipu = poptorch.trainingModel(model, optimizer=opt)
    ref = torch.optim.SGD(twin.parameters(), lr=0.1)
    x, t = _data()
    ipu(x, t)
    _eager_step(twin, ref, x, t)
    for group in (*opt.param_groups, *ref.param_groups):
        group["lr"] = 0.05
    ipu(x, t)
    _eager_step(twin, ref, x, t)
    ipu.setOptimizer(poptorch.optim.SGD(model.parameters(), lr=0.5))
    ref = torch.optim.SGD(twin.parameters(), lr=0.5)
    ipu(x, t)
    _eager_step(twin, ref, x, t)
    assert torch.equal(model.fc.weight, twin.fc.weight)


def test_executor_lifecycle():
    model = Net().eval()
    ipu = poptorch.inferenceModel(model)
    assert not ipu.isCompiled()
    with pytest.raises(poptorch.Error, match="isn't compiled"):
        ipu.detachFromDevice()
    ipu.compile(_data()[0])
    assert ipu.isCompiled() and ipu.isAttachedToDevice()
    ipu.detachFromDevice()
    ipu.attachToDevice()
    ipu.copyWeightsToHost()
    ipu.destroy()
    assert not ipu.isCompiled()
    assert ipu.fc is model.fc  # attributes reach the model, as PopTorch's executor
