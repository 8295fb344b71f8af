"""popxl_fx.poptorch: PopTorch's device copy of the weights and buffers, its implicit copies
between device and host (counted as PopTorch's tests count them), the broadcast-buffers
error with replicas, and plain tensor attributes as constants."""

from __future__ import annotations

import copy
import io
import types

import pytest
import torch
from torch import nn

import popxl_fx.poptorch as poptorch


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, target=None):
        out = self.fc(x)
        return out if target is None else (out, nn.functional.mse_loss(out, target))


def _data():
    g = torch.Generator().manual_seed(3)
    return torch.randn(2, 4, generator=g), torch.randn(2, 4, generator=g)


def _counted(executor) -> list:
    """Count the executor's ``copyWeightsToHost`` calls (implicit ones included)."""
    calls, real = [], executor.copyWeightsToHost

    def counting(self):
        calls.append(1)
        real()

    executor.copyWeightsToHost = types.MethodType(counting, executor)
    return calls


def test_an_inference_executor_keeps_the_weights_it_attached_with():
    torch.manual_seed(0)
    model, (x, _) = _Net(), _data()
    infer = poptorch.inferenceModel(model)
    before = infer(x)
    with torch.no_grad():
        model.fc.weight.add_(1.0)  # a host write: not on the device until copied
    assert torch.equal(infer(x), before)
    infer.copyWeightsToDevice()
    assert torch.equal(infer(x), model(x).detach())


def test_training_copies_to_the_host_once_when_the_model_is_read():
    torch.manual_seed(0)
    model, (x, t) = _Net(), _data()
    train = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    calls = _counted(train)
    weight = model.fc.weight.detach().clone()
    train(x, t)
    train(x, t)
    assert calls == []  # training alone copies nothing
    assert not torch.equal(model.fc.weight, weight)  # reading the weight copies it back
    assert calls == [1]
    str(model.fc.weight), model.state_dict(), model(x)
    assert calls == [1]  # once per call


def test_an_inference_executor_takes_the_trained_weights_through_the_host():
    torch.manual_seed(0)
    model, (x, t) = _Net(), _data()
    train = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    infer = poptorch.inferenceModel(model)
    calls = _counted(train)
    before = infer(x)
    train(x, t)
    after = infer(x)
    assert calls == [1] and not torch.equal(before, after)
    assert torch.equal(after, model(x).detach())


def test_copy_weights_to_device_overwrites_the_trained_weights():
    torch.manual_seed(0)
    model, (x, t) = _Net(), _data()
    untrained = model(x).detach()
    train = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    train(x, t)
    train.copyWeightsToDevice()  # the host still has the untrained weights
    train.setOptimizer(torch.optim.SGD(model.parameters(), lr=0.0))
    out, _ = train(x, t)
    assert torch.equal(out, untrained)


class _Buffers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("a", torch.ones(1))
        self.register_buffer("b", torch.ones(1))

    def forward(self, x):
        return torch.sum(x + self.a + self.b)


def test_copy_named_buffers_writes_only_the_updatable_ones():
    options = poptorch.Options()
    options.updatableNamedBuffers(["a"])
    infer = poptorch.inferenceModel(_Buffers(), options)
    x = torch.ones(3)
    assert infer(x) == 9
    infer.a.add_(1)
    infer.b.add_(1)
    infer.copyNamedBuffersToDevice()
    assert infer(x) == 12


def test_copy_named_buffers_without_the_option_raises():
    infer = poptorch.inferenceModel(_Buffers())
    x = torch.ones(3)
    assert infer(x) == 9
    infer.a.add_(1)
    with pytest.raises(poptorch.Error, match="No named buffers marked as updatable"):
        infer.copyNamedBuffersToDevice()
    assert infer(x) == 9


class _Counter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.register_buffer("count", torch.zeros(2))

    def forward(self, x, target):
        out = self.fc(x)
        with torch.no_grad():
            self.count += 1
        return out, nn.functional.l1_loss(out, target)


def test_a_buffer_updated_in_forward_with_broadcast_replicas_raises():
    model = _Counter()
    options = poptorch.Options().replicationFactor(2)
    train = poptorch.trainingModel(model, options, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(poptorch.Error, match="does not support broadcasting buffers"):
        train(torch.ones(4, 2), torch.zeros(4, 2))


def test_a_trained_buffer_reaches_the_host_when_read():
    model = _Counter()
    train = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    train(torch.ones(2, 2), torch.zeros(2, 2))
    train(torch.ones(2, 2), torch.zeros(2, 2))
    assert torch.equal(train.count, torch.full((2,), 2.0))


class _PlainAttribute(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.x = torch.tensor([1.0])

    def forward(self, y):
        self.x += self.x
        return y + self.x


def test_a_plain_tensor_attribute_is_a_constant_of_the_program():
    model = _PlainAttribute()
    infer = poptorch.inferenceModel(model)
    y = torch.zeros(1)
    assert torch.equal(infer(y), torch.tensor([2.0]))
    assert torch.equal(infer(y), torch.tensor([2.0]))  # the write is not kept
    assert torch.equal(model.x, torch.tensor([1.0]))


class _Norm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(3)
        with torch.no_grad():
            self.bn.running_mean.add_(torch.arange(3.0))

    def forward(self, x):
        return self.bn(x), self.bn.running_mean


def test_an_inference_batch_norm_normalises_by_the_batch_and_keeps_its_statistics():
    torch.manual_seed(0)
    model, x = _Norm(), torch.randn(4, 3, 5)
    kept = model.bn.running_mean.clone()
    eager = nn.functional.batch_norm(x, None, None, model.bn.weight, model.bn.bias, True)
    infer = poptorch.inferenceModel(model)
    for _ in range(2):
        out, mean = infer(x)
        assert torch.equal(out, eager.detach()) and torch.equal(mean, kept)
    infer.copyWeightsToHost()
    assert torch.equal(model.bn.running_mean, kept)


def test_a_half_inference_batch_norm_with_float_statistics_runs_in_half():
    model = _Norm()
    model.bn.half()
    model.bn.running_mean = model.bn.running_mean.float()
    model.bn.running_var = model.bn.running_var.float()
    out, mean = poptorch.inferenceModel(model)(torch.ones(4, 3, 5).half())
    assert out.dtype == torch.float16 and torch.equal(mean, torch.arange(3.0))


def test_copies_and_saved_states_of_a_trained_model_are_plain_and_trained():
    torch.manual_seed(0)
    model, (x, t) = _Net(), _data()
    train = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    train(x, t)
    twin = copy.deepcopy(model)
    assert type(twin.fc.weight) is nn.Parameter
    saved = io.BytesIO()
    torch.save(model.state_dict(), saved)
    saved.seek(0)
    loaded = torch.load(saved)  # weights_only: no PopTorch class in the file
    assert torch.equal(loaded["fc.weight"], twin.fc.weight.detach())
    train.copyWeightsToDevice()
    assert torch.equal(train(x, t)[0], twin(x).detach())


def test_the_device_copy_follows_tensors_the_model_gains_or_replaces():
    # the walk over the model's tensors is cached between calls; a registration renews it
    from popxl_fx.poptorch.device_copy import DeviceCopy

    model = _Net()
    device = DeviceCopy(model)
    with device.swapped_in() as hosts:
        assert set(hosts) == {"fc.weight", "fc.bias"}
    model.register_buffer("scale", torch.ones(4))
    model.fc.weight = nn.Parameter(torch.zeros(4, 4))
    with device.swapped_in() as hosts:
        assert set(hosts) == {"fc.weight", "fc.bias", "scale"}
        assert hosts["fc.weight"][0] is model.fc.weight
