"""Other ops as PopTorch programs use them (PopTorch's other_ops_test): bucketize,
index_reduce, in-place updates of tensors forward makes, and a call returning a one-tuple,
each compared with eager torch at tolerance 0."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import popxl_fx.poptorch as poptorch

from .test_poptorch_math_ops import Fn, _infer


class Trained(nn.Module):
    """A linear layer before ``fn`` (first input only), returning ``fn``'s output whole and a
    loss of ``pick(output)``: the shape of PopTorch's ``helpers.ModelWithWeights``."""

    def __init__(self, fn, shape, pick) -> None:
        super().__init__()
        self.fn, self.shape, self.pick = fn, shape, pick
        self.lin = nn.Linear(shape.numel(), shape.numel())

    def forward(self, x, *rest):
        y = self.fn(self.lin(x.flatten()).reshape(self.shape), *rest)
        return y, poptorch.identity_loss(self.pick(y) ** 2, reduction="sum")


def _train(fn, x, *rest, pick=lambda y: y):
    torch.manual_seed(0)
    model = Trained(fn, x.shape, pick)
    eager = copy.deepcopy(model)
    ipu = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    out, loss = ipu(x, *rest)
    opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    want, want_loss = eager(x, *rest)
    want_loss.backward()
    opt.step()
    assert type(out) is type(want) and torch.equal(loss, want_loss.detach())
    for got, exp in zip(pytree_leaves(out), pytree_leaves(want)):
        assert torch.equal(got, exp.detach())
    assert torch.equal(model.lin.weight, eager.lin.weight)


def pytree_leaves(x):
    return list(x) if isinstance(x, tuple) else [x]


@pytest.mark.parametrize("right", [False, True])
@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float32), (torch.int32, torch.float32)])
def test_bucketize(right, dtypes):
    x = torch.tensor([[3, 6, 9], [3, 6, 10], [-1, 0, 1]], dtype=dtypes[0])
    boundaries = torch.tensor([1, 3, 5, 7, 9], dtype=dtypes[1])
    _infer(lambda a, b: torch.bucketize(a, b, right=right), x, boundaries)


@pytest.mark.parametrize("reduce", ["mean", "amax", "prod"])
def test_index_reduce_in_place_trains(reduce):
    g = torch.Generator().manual_seed(2)
    x, src = torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)
    index = torch.randint(0, 3, (3,), generator=g)
    _train(lambda y, i, s: y.index_reduce_(1, i, s, reduce, include_self=False), x, index, src)


def test_meshgrid_of_one_tensor_returns_a_one_tuple():
    """A call returning a tuple keeps it in forward's output (a graph output of its own)."""
    _train(lambda y: torch.meshgrid(y, indexing="ij"), torch.randn(3), pick=lambda y: y[0])
    out = poptorch.inferenceModel(Fn(lambda y: (torch.meshgrid(y, indexing="ij"), y)))(
        torch.ones(3)
    )
    assert isinstance(out[0], tuple) and len(out[0]) == 1


@pytest.mark.parametrize(
    "update",
    [
        lambda t, s, i: t.add_(s),
        lambda t, s, i: t.scatter_add_(1, i, s),
        lambda t, s, i: t.index_add_(0, i[0, :2], s),
    ],
)
def test_in_place_update_of_a_tensor_forward_makes(update):
    """``torch.ones(...)`` made in forward is new in each eager call: an in-place update of it
    is neither hidden state nor a change to the captured constant."""
    x, index = torch.ones(2, 3), torch.tensor([[0, 0, 1], [2, 2, 2]])
    model = poptorch.inferenceModel(Fn(lambda s, i: update(torch.ones(2, 3), s, i)))
    for _ in range(2):
        assert torch.equal(model(x, index), update(torch.ones(2, 3), x, index))


def test_cpu_op_of_a_layer_the_model_does_not_hold():
    """``poptorch.CPU(layer)`` where ``layer`` is not a submodule (kept in a list): PopTorch
    runs it on the host; its weights are the program's constants."""

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.held = [nn.Linear(4, 3)]
            self.cpu = poptorch.CPU(self.held[0], "MatMulOnCPU")

        def forward(self, x):
            return self.cpu(x) * 2

    model, x = Model(), torch.randn(5, 4)
    assert torch.equal(poptorch.inferenceModel(model)(x), model.held[0](x) * 2)
