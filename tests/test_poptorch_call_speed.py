"""The per-call work a planned training call skips (`call_plan`, `device_copy`): its outputs
come from a getter made once per program, the device's tensors from a list made once per
walk; each gives what the full path gives, and the full path runs again when what it
depends on changes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import popxl_fx.poptorch as poptorch
from popxl_fx.poptorch import executor_outputs
from popxl_fx.poptorch.device_copy import DeviceCopy


class _Net(nn.Module):
    def __init__(self, returns: str = "pair") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(6, 3)
        self.loss = nn.CrossEntropyLoss()
        self.returns = returns

    def forward(self, x, labels):
        out = self.fc(x)
        loss = self.loss(out, labels)
        if self.returns == "loss":
            return loss
        if self.returns == "dict":
            return {"out": out, "loss": loss}
        return out, loss


def _batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g)


def _trainer(returns: str = "pair"):
    model = _Net(returns)
    opt = poptorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, poptorch.trainingModel(model, poptorch.Options(), opt)


def _count_selections(monkeypatch) -> list:
    """The calls of the executor's full selection of a training call's outputs (counted)."""
    calls, select = [], executor_outputs.TrainingOutputs._training_outputs
    monkeypatch.setattr(
        executor_outputs.TrainingOutputs,
        "_training_outputs",
        lambda self, *a: calls.append(1) or select(self, *a),
    )
    return calls


def _eager(model: _Net, x: torch.Tensor, labels: torch.Tensor):
    with torch.no_grad():
        out = model.fc(x)
        return out, model.loss(out, labels)


def test_planned_training_outputs_skip_the_selection_and_match_eager(monkeypatch):
    calls = _count_selections(monkeypatch)
    model, ipu = _trainer()
    for seed in range(4):
        x, labels = _batch(seed)
        want = _eager(model, x, labels)  # the host model reads the trained weights first
        got = ipu(x, labels)
        assert type(got) is tuple and len(got) == 2
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert len(calls) == 1  # the full call's only


def test_a_lone_loss_comes_back_as_a_tensor_on_planned_calls():
    model, ipu = _trainer("loss")
    for seed in range(3):
        x, labels = _batch(seed)
        want = _eager(model, x, labels)[1]
        got = ipu(x, labels)
        assert type(got) is torch.Tensor and torch.equal(got, want)


def test_a_dict_output_keeps_the_full_selection(monkeypatch):
    calls = _count_selections(monkeypatch)
    _, ipu = _trainer("dict")
    for _ in range(3):
        out = ipu(*_batch())
        assert set(out) == {"out", "loss"}
    assert len(calls) == 3


def test_a_program_rebuilt_by_the_step_takes_the_full_selection_again(monkeypatch):
    calls = _count_selections(monkeypatch)
    model, ipu = _trainer()
    x, labels = _batch()
    ipu(x, labels)
    ipu(x, labels)
    assert len(calls) == 1
    model.fc.bias.requires_grad_(False)  # a new program, built inside the trainer's step
    want = _eager(model, x, labels)
    got = ipu(x, labels)
    assert len(calls) == 2
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    ipu(x, labels)  # a full call (the plan was the old program's), planned again
    ipu(x, labels)
    assert len(calls) == 3


def test_the_device_copy_follows_host_data_replaced_in_another_shape():
    model = _Net()
    device = DeviceCopy(model)
    device.write()
    with device.swapped_in() as hosts:
        first = model.fc.weight.data
        assert hosts["fc.weight"][0] is model.fc.weight
    with device.swapped_in():
        assert model.fc.weight.data.data_ptr() == first.data_ptr()  # the listed tensor
    model.fc.weight.data = torch.full((2, 6), 3.0)  # no registration: only the data moved
    with device.swapped_in():
        assert torch.equal(model.fc.weight, torch.full((2, 6), 3.0))  # a new device copy
    assert model.fc.weight.shape == (2, 6)
    device.clear()
    with device.swapped_in():  # cleared: every device tensor made again from the host
        assert model.fc.weight.data.data_ptr() != first.data_ptr()


def _settling(ipu):
    """``ipu`` whose calls each put the host's data back at once (the path before parking)."""

    def call(*args):
        out = ipu(*args)
        ipu._device.settle()
        return out

    return call


def _twins():
    model_a, parked = _trainer()
    model_b, settled = _trainer()
    return (model_a, parked), (model_b, _settling(settled))


def test_training_calls_park_the_device_tensors_until_the_model_is_read():
    (model, ipu), (twin, settled) = _twins()
    x, labels = _batch()
    for _ in range(3):
        ipu(x, labels)
        settled(x, labels)
    device = ipu._device
    assert device._parked is not None  # nothing swapped back between the calls
    assert torch.equal(model.fc.weight, twin.fc.weight)  # the read copies, as PopTorch
    assert device._parked is None
    with torch.no_grad():  # a host write after the read: the device keeps its own values
        model.fc.weight.fill_(0.0)
        twin.fc.weight.fill_(0.0)
    ipu(x, labels)
    settled(x, labels)
    assert torch.equal(model.fc.weight, twin.fc.weight)
    assert model.fc.weight.abs().sum() > 0


def test_data_assigned_while_parked_is_the_hosts_and_the_device_keeps_its_own():
    (model, ipu), (twin, settled) = _twins()
    x, labels = _batch()
    for run in (ipu, settled, ipu, settled):
        run(x, labels)
    for m in (model, twin):
        m.fc.bias.data = torch.full((3,), 5.0)  # the host's (torch's setter calls the hook)
    ipu(x, labels)  # the device's bias, not 5s
    settled(x, labels)
    assert torch.equal(model.fc.bias, twin.fc.bias)
    assert not torch.equal(model.fc.bias, torch.full((3,), 5.0))


def test_a_tensor_gained_while_parked_takes_the_full_swap():
    (model, ipu), (twin, settled) = _twins()
    x, labels = _batch()
    ipu(x, labels)
    settled(x, labels)
    parked = ipu._device._parked
    for m in (model, twin):
        m.register_buffer("seen", torch.ones(2))  # a registration: a new walk
    ipu(x, labels)
    settled(x, labels)
    assert ipu._device._parked is not parked
    assert torch.equal(model.fc.weight, twin.fc.weight)
    assert torch.equal(model.seen, torch.ones(2))


def test_a_failed_call_leaves_nothing_parked():
    model, ipu = _trainer()
    x, labels = _batch()
    ipu(x, labels)
    host = model.fc.weight.data.data_ptr()  # a read: settled
    with pytest.raises(poptorch.Error):
        ipu(torch.randn(5, 6), labels)
    assert ipu._device._parked is None
    assert model.fc.weight.data.data_ptr() == host


def test_a_non_tensor_argument_after_planned_calls_meets_the_full_paths_check():
    _, ipu = _trainer()
    x, labels = _batch()
    ipu(x, labels)
    ipu(x, labels)
    with pytest.raises(poptorch.Error, match="labels"):
        ipu(x, [1, 2, 0, 1])
    ipu(x, labels)  # the compiled inputs still run


def test_data_replaced_where_no_hook_saw_it_is_the_hosts_and_not_the_devices():
    (model, ipu), (twin, settled) = _twins()
    x, labels = _batch()
    for run in (ipu, settled, ipu, settled):
        run(x, labels)
    assert ipu._device._parked is not None
    for m in (model, twin):
        bias = m.fc.bias
        hooked = type(bias)
        bias.__class__ = nn.Parameter  # as the hooks' own plain-class reads do
        bias.data = torch.full((3,), 5.0)
        bias.__class__ = hooked
    ipu(x, labels)  # the parked swap sees other data: the full swap, the device's bias
    settled(x, labels)
    assert torch.equal(model.fc.bias, twin.fc.bias)
    assert torch.equal(model.fc.weight, twin.fc.weight)


def test_a_detached_executor_takes_the_full_path_which_writes_the_hosts_weights(monkeypatch):
    from popxl_fx.poptorch import executor

    repeats, repeat = [], executor.PoplarExecutor._repeat
    monkeypatch.setattr(
        executor.PoplarExecutor,
        "_repeat",
        lambda self, *a: repeats.append(self) or repeat(self, *a),
    )
    model, ipu = _trainer()
    twin = _Net()  # eager: the same SGD with momentum, on the host
    opt = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    x, labels = _batch()

    def eager_step():
        opt.zero_grad()
        twin.loss(twin.fc(x), labels).backward()
        opt.step()

    for _ in range(3):
        ipu(x, labels)
        eager_step()
    assert repeats.count(ipu) == 2  # the calls after the first
    ipu.detachFromDevice()
    with torch.no_grad():
        model.fc.weight.fill_(0.5)
        twin.fc.weight.fill_(0.5)
    ipu(x, labels)  # re-attaching writes the host's weights
    eager_step()
    assert repeats.count(ipu) == 2
    assert torch.equal(model.fc.weight, twin.fc.weight)
    ipu(x, labels)
    assert repeats.count(ipu) == 3
