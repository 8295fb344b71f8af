"""popxl_fx.poptorch: outputs of custom types (a registered parser's, a dict subclass) are
rebuilt around the program's tensors, as PopTorch rebuilds them; compared with eager."""

from __future__ import annotations

import collections
import copy

import pytest
import torch
from torch import nn

import popxl_fx.poptorch as poptorch


class _Bag:
    """A custom type holding tensors as attributes."""

    def __init__(self, **fields) -> None:
        vars(self).update(fields)


class _BagParser(poptorch.ICustomArgParser):
    """Yields only real tensors, by sorted name, as PopTorch's own example parser does."""

    def yieldTensors(self, struct):
        for key in sorted(vars(struct)):
            if isinstance(vars(struct)[key], torch.Tensor):
                yield vars(struct)[key]

    def reconstruct(self, original_structure, tensor_iterator):
        return _Bag(**{key: next(tensor_iterator) for key in sorted(vars(original_structure))})


class _SubBag(_Bag):
    """A subclass: PopTorch uses its base class's parser."""


class _Ordered(collections.OrderedDict):
    """A dict subclass, which PopTorch takes without a parser."""


@pytest.fixture
def bag_parser():
    poptorch.registerCustomArgParser(_Bag, _BagParser())
    yield
    poptorch.registerCustomArgParser(_Bag, None)


class _Doubles(nn.Module):
    def forward(self, bag):
        bag.result = bag.tensor * 2 + 1
        return bag


@pytest.mark.parametrize("iterations", [1, 3])
def test_a_custom_output_is_rebuilt_by_its_parser(bag_parser, iterations):
    ipu = poptorch.inferenceModel(_Doubles(), poptorch.Options().deviceIterations(iterations))
    for step in range(2):
        x = torch.randn(2 * iterations, 3) + step
        out = ipu(_Bag(tensor=x))
        assert type(out) is _Bag and sorted(vars(out)) == ["result", "tensor"]
        assert torch.equal(out.tensor, x) and torch.equal(out.result, x * 2 + 1)


def test_a_base_class_parser_takes_a_subclass(bag_parser):
    ipu = poptorch.inferenceModel(_Doubles())
    x = torch.randn(2, 3)
    out = ipu(_SubBag(tensor=x))
    assert type(out) is _Bag and torch.equal(out.result, x * 2 + 1)


def test_a_dict_subclass_output_keeps_its_type_and_order():
    class Parts(nn.Module):
        def forward(self, x):
            out = _Ordered()
            out["z"], out["a"] = x.sin(), x.cos() * 3
            return out

    x = torch.randn(4, 2)
    eager, out = Parts()(x), poptorch.inferenceModel(Parts())(x)
    assert type(out) is _Ordered and list(out) == ["z", "a"]
    assert all(torch.equal(out[k], eager[k]) for k in eager)


def test_a_training_model_returns_a_custom_output_beside_its_loss(bag_parser):
    class Fit(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 2)

        def forward(self, x, y):
            out = self.lin(x)
            return _Bag(out=out), poptorch.identity_loss((out - y).pow(2), reduction="mean")

    torch.manual_seed(0)
    model = Fit()
    eager = copy.deepcopy(model)
    ipu = poptorch.trainingModel(model, optimizer=poptorch.optim.SGD(model.parameters(), lr=0.1))
    x, y = torch.randn(4, 3), torch.randn(4, 2)
    bag, loss = ipu(x, y)
    want = eager.lin(x)
    assert type(bag) is _Bag and torch.equal(bag.out, want.detach())
    assert torch.equal(loss, (want - y).pow(2).mean().detach())


def test_a_model_output_is_returned_as_popxl_fx_returns_it():
    """HuggingFace's ModelOutput is a dict subclass and a dataclass (it refuses ``update``):
    popxl_fx returns it itself, not through the dict-subclass parser."""
    outputs = pytest.importorskip("transformers.modeling_outputs")

    class Hidden(nn.Module):
        def forward(self, x):
            return outputs.BaseModelOutput(last_hidden_state=x * 2, hidden_states=(x, x + 1))

    x = torch.randn(2, 3)
    out = poptorch.inferenceModel(Hidden())(x)
    assert type(out) is outputs.BaseModelOutput and list(out) == [
        "last_hidden_state",
        "hidden_states",
    ]
    assert torch.equal(out.last_hidden_state, x * 2) and torch.equal(out.hidden_states[1], x + 1)
