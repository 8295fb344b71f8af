"""`popxl_fx.poptorch.call_plan`: a call on inputs like the last one's skips the executor's
per-call binding, checks and narrowing, gives the numbers the full path gives, and any change
of the inputs (or of the program) still meets PopTorch's checks on the full path."""

from __future__ import annotations

import collections
import copy
import logging
import typing

import pytest
import torch
import torch.utils._pytree as pytree
from torch import nn

import popxl_fx.poptorch as poptorch
from popxl_fx import module_outputs
from popxl_fx.poptorch import executor


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(6, 3)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x, labels=None):
        out = self.fc(x)
        if labels is None:
            return out
        return out, self.loss(out, labels)


def _batch(rows: int = 4, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 6, generator=g), torch.randint(0, 3, (rows,), generator=g)


def _trainer(opts: poptorch.Options | None = None):
    model = _Net()
    opt = poptorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, poptorch.trainingModel(model, opts or poptorch.Options(), opt)


def _count_binding(monkeypatch) -> list:
    """The calls of the executor's binding of arguments (the real one, counted)."""
    calls, bind = [], executor.binding.bind
    monkeypatch.setattr(executor.binding, "bind", lambda *a: calls.append(1) or bind(*a))
    return calls


def test_repeated_calls_skip_the_binding_and_checks(monkeypatch):
    calls = _count_binding(monkeypatch)
    _, ipu = _trainer()
    x, labels = _batch()
    for _ in range(4):
        ipu(x, labels)
    assert len(calls) == 1  # the first call only


def _train(ipu, batches, full: bool) -> list:
    outs = []
    for x, labels in batches:
        if full:
            ipu._plan = None  # every call on the full path
        outs.append(ipu(x, labels))
    return outs


def _replicas_and_accumulation(opts: poptorch.Options) -> poptorch.Options:
    opts.Training.gradientAccumulation(2)
    return opts.replicationFactor(2)


@pytest.mark.parametrize(
    "opts",
    [lambda o: o, lambda o: o.deviceIterations(2), _replicas_and_accumulation],
    ids=["plain", "device_iterations", "replicas_and_accumulation"],
)
def test_planned_calls_give_the_full_paths_numbers(opts):
    batches = [_batch(8, seed) for seed in range(4)]
    model_a, fast = _trainer(opts(poptorch.Options()))
    model_b, full = _trainer(opts(poptorch.Options()))
    got, want = _train(fast, batches, False), _train(full, batches, True)
    for (out_a, loss_a), (out_b, loss_b) in zip(got, want):
        assert torch.equal(out_a, out_b) and torch.equal(loss_a, loss_b)
    assert torch.equal(model_a.fc.weight, model_b.fc.weight)


def test_a_changed_shape_or_dtype_still_raises_poptorchs_error():
    _, ipu = _trainer()
    x, labels = _batch()
    ipu(x, labels)
    ipu(x, labels)
    with pytest.raises(poptorch.Error, match="Shape mismatch for input 0"):
        ipu(torch.randn(5, 6), labels)
    with pytest.raises(poptorch.Error, match="Data type mismatch for input 0"):
        ipu(x.double(), labels)
    with pytest.raises(poptorch.Error, match="Type mismatch for labels"):
        ipu(x)  # labels left out: its default None against a tensor
    ipu(x, labels)  # the compiled inputs still run


def test_a_changed_shape_after_destroy_builds_again():
    model, ipu = _trainer()
    ipu(*_batch(4))
    ipu(*_batch(4))
    ipu.destroy()
    x, labels = _batch(6)
    with torch.no_grad():
        want = model.loss(model.fc(x), labels)  # eager, before the step
    out, loss = ipu(x, labels)
    assert out.shape == (6, 3) and torch.equal(loss, want)


def test_keyword_arguments_take_the_full_path(monkeypatch):
    calls = _count_binding(monkeypatch)
    _, ipu = _trainer()
    x, labels = _batch()
    ipu(x, labels)
    ipu(x, labels)
    ipu(x, labels=labels)
    assert len(calls) == 2


def test_an_input_requiring_grad_is_still_detached_with_poptorchs_warning(caplog):
    _, ipu = _trainer()
    x, labels = _batch()
    ipu(x, labels)
    ipu(x, labels)
    with caplog.at_level(logging.WARNING):
        ipu(x.clone().requires_grad_(), labels)
    assert "requires_grad=True" in caplog.text


def test_a_new_optimizer_builds_a_new_program():
    model, ipu = _trainer()
    x, labels = _batch()
    ipu(x, labels)
    ipu(x, labels)
    ipu.setOptimizer(poptorch.optim.SGD(model.parameters(), lr=0.0))
    before = copy.deepcopy(model.fc.weight)
    ipu(x, labels)
    assert torch.equal(model.fc.weight, before)  # lr 0: the new optimizer's program ran


class _WithConstant(nn.Module):
    def forward(self, x):
        return x.argmax(1), torch.arange(3)  # the constant comes back int64 from the program


def test_64_bit_outputs_are_narrowed_on_every_call():
    ipu = poptorch.inferenceModel(_WithConstant())
    x = torch.randn(4, 6)
    for _ in range(3):
        index, constant = ipu(x)
        assert index.dtype == torch.int32 and constant.dtype == torch.int32
        assert torch.equal(index, x.argmax(1).int())
        assert torch.equal(constant, torch.arange(3).int())


class _Pair(typing.NamedTuple):
    a: object
    b: object


@pytest.mark.parametrize(
    "tree",
    [
        torch.ones(1),
        (1, (2, 3)),
        [1, {"b": 2, "a": (3, None)}],
        _Pair(1, [2, 3]),
        collections.OrderedDict(z=1, y=(2,)),
        collections.defaultdict(list, k=[1, 2]),
        (),
    ],
)
def test_the_planned_rebuild_of_outputs_is_torchs_unflatten(tree):
    leaves, spec = pytree.tree_flatten(tree)
    fresh = [object() for _ in leaves]
    got = module_outputs._rebuilder(spec)(iter(fresh))
    want = pytree.tree_unflatten(fresh, spec)
    assert type(got) is type(want) and pytree.tree_flatten(got) == pytree.tree_flatten(want)


class _WithNone(nn.Module):
    def forward(self, x):
        return {"twice": x * 2, "none": None}, x + 1


def test_outputs_keep_their_structure_and_nones_on_every_call():
    ipu = poptorch.inferenceModel(_WithNone(), poptorch.Options().replicationFactor(2))
    x = torch.randn(4, 6)
    for _ in range(3):
        outs, plus = ipu(x)
        assert set(outs) == {"twice", "none"} and outs["none"] is None
        assert torch.equal(outs["twice"], x * 2) and torch.equal(plus, x + 1)
