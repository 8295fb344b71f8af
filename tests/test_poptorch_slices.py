"""``poptorch.dynamic_slice`` / ``dynamic_update`` (popxl_fx.poptorch.slices,
popxl_fx.lowerings.dynamic): a window at a start computed in the model, read on the device,
compared with eager PyTorch bit for bit; and PopTorch's errors for what it refuses."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import popxl_fx.poptorch as poptorch


class Slice(nn.Module):
    def __init__(self, size, step):
        super().__init__()
        self.size, self.step = size, step

    def forward(self, t, start):
        return poptorch.dynamic_slice(t, 1, start - 1, self.size, self.step) * 2.0


class Update(nn.Module):
    def forward(self, t, src, start):
        return poptorch.dynamic_update(t, src, 1, start.to(torch.int32), src.shape[1])


@pytest.mark.parametrize("step", [1, 2])
def test_dynamic_slice_reads_its_start_when_it_runs(step):
    model, t = Slice(4, step), torch.randn(3, 8)
    run = poptorch.inferenceModel(model)
    run.compile(torch.randn(3, 8), torch.tensor([20]))  # the start is not frozen at compile
    for start in (1, 3, 5):
        s = torch.tensor([start])
        assert torch.equal(run(t, s), model(t, s))


def test_dynamic_update_writes_at_its_start_when_it_runs():
    model, t, src = Update(), torch.randn(2, 6), torch.randn(2, 2)
    run = poptorch.inferenceModel(model)
    for start in (0, 2, 4):
        s = torch.tensor([start])
        assert torch.equal(run(t, src, s), model(t, src, s))


@pytest.mark.parametrize(
    "size, message",
    [
        (0, "The start and end of a slice must be different"),
        (-2, "end less than the start is not supported"),
        (3, r"The size of the slice \(3\) must be a factor of the slicing dimension \(8\)"),
    ],
)
def test_dynamic_slice_refuses_what_poptorch_refuses(size, message):
    run = poptorch.inferenceModel(Slice(size, 1))
    with pytest.raises(poptorch.Error, match=message):
        run(torch.randn(3, 8), torch.tensor([2]))


def test_dynamic_update_names_the_dtypes_the_ipu_holds():
    class Mixed(nn.Module):
        def forward(self, t, src, start):
            return poptorch.dynamic_update(t, src, 0, start, 1)

    run = poptorch.inferenceModel(Mixed())
    with pytest.raises(poptorch.Error, match=r"\(torch.float32 vs torch.int32\)"):
        run(torch.randn(4), torch.tensor([1]), torch.tensor([0]))
