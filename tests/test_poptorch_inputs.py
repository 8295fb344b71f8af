"""Inputs as PopTorch's tests use them: forward inspecting its inputs' types, and PopTorch's
error for a call whose tensors differ from the compiled ones."""

from __future__ import annotations

import collections

import pytest
import torch
from torch import nn

import popxl_fx
import popxl_fx.poptorch as poptorch


class _Checks(nn.Module):
    def forward(self, pair, n):
        assert isinstance(pair, tuple) and not isinstance(pair[0], tuple)
        x, y = pair
        assert isinstance(x, torch.Tensor) and isinstance(y, (int, torch.Tensor))
        k = x.shape[0]
        assert isinstance(k, int) and not isinstance(x, int)
        return x * y + n if isinstance(n, int) else x + y


def test_forward_sees_its_inputs_types_as_in_eager():
    x, y = torch.arange(3.0), torch.ones(3)
    got = poptorch.inferenceModel(_Checks())((x, y), 2)
    assert torch.equal(got, _Checks()((x, y), 2))

    class Plain(nn.Module):
        def forward(self, x):
            assert isinstance(x, torch.Tensor) and not isinstance(x, nn.Module)
            return x * 2

    assert torch.equal(popxl_fx.inference_model(Plain())(x), x * 2)


def test_a_call_with_other_dtypes_or_shapes_raises_until_destroyed():
    class Adder(nn.Module):
        def forward(self, t):
            return t[0] + t[1]

    model = poptorch.inferenceModel(Adder())
    assert model((torch.tensor([1.0]), torch.tensor([2.0]))) == 3.0
    ints = (torch.tensor([1]), torch.tensor([2]))
    with pytest.raises(poptorch.Error, match="expected torch.float32 but got torch.int64"):
        model(ints)
    with pytest.raises(poptorch.Error, match=r"expected torch.Size\(\[1\]\) but got"):
        model((torch.ones(2), torch.ones(2)))
    model.destroy()
    assert model(ints) == 3


def test_a_dict_subclass_argument_needs_no_parser():
    class Batch(collections.OrderedDict):
        pass

    class Model(nn.Module):
        def forward(self, batch):
            assert isinstance(batch, Batch)
            return batch["a"] * 2 + batch["b"]

    model = Model()
    executor = poptorch.inferenceModel(model)
    for _ in range(2):
        batch = Batch(b=torch.randn(2, 2), a=torch.randn(2, 2))
        assert torch.equal(executor(batch), model(batch))  # new values, not the first call's


def test_a_dict_argument_with_other_keys_raises_poptorchs_error():
    class Divider(nn.Module):
        def forward(self, d):
            return d["x"] / d["y"]

    executor = poptorch.inferenceModel(Divider())
    x, y = torch.tensor([1.0]), torch.tensor([2.0])
    assert executor({"x": x, "y": y}) == 0.5
    assert executor({"y": y, "x": x}) == 0.5  # the order of the keys does not matter
    with pytest.raises(poptorch.Error, match="Missing arguments: x."):
        executor({"y": y})
    with pytest.raises(poptorch.Error, match="Unexpected arguments: z."):
        executor({"x": x, "y": y, "z": y})
