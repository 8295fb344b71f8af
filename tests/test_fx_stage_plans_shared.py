"""A stage recorded right after another, with no op built between them, keeps that record's
plan (`pipeline.Build.record(unchanged=True)`) instead of planning the same program again:
the phased step's "optimizer" after its "replication", the loops' "batch_serialisation"
after their "accumulation". Every such record is checked here against a plan of its own."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import popxl_fx
import popxl_fx.pipeline
from examples.fx_phased import Decoder

Build = popxl_fx.pipeline.Build


def _shared_records(make_trainer, batch) -> list[str]:
    """The stages recorded as unchanged while ``make_trainer()``'s program builds, each
    asserted equal to a fresh plan of the program at that point."""
    record, shared = Build.record, []

    def checked(self, name, detail, *args, **kwargs):
        stage = record(self, name, detail, *args, **kwargs)
        if kwargs.get("unchanged"):
            assert (stage.graphs, stage.memory) == self._plan(), name
            shared.append(name)
        return stage

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Build, "record", checked)
        make_trainer().build(*batch)
    return shared


def test_the_replicated_phased_step_plans_its_optimizer_with_its_replication():
    torch.manual_seed(0)
    model = Decoder(32, 8, 16, 2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    options = popxl_fx.Options(device="cpu", phased_execution="blocks", replication_factor=2)
    g = torch.Generator().manual_seed(1)
    batch = [torch.randint(0, 32, (4, 8), generator=g) for _ in range(2)]
    make = lambda: popxl_fx.training_model(model, opt, options=options)
    assert _shared_records(make, batch) == ["optimizer"]


def test_serialised_accumulation_plans_its_slices_with_its_micro_batches():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    options = popxl_fx.Options(device="cpu", gradient_accumulation=2, batch_serialisation=2)
    batch = torch.randn(8, 8), torch.randint(0, 4, (8,))
    loss = nn.CrossEntropyLoss()
    make = lambda: popxl_fx.training_model(model, opt, loss, options)
    assert _shared_records(make, batch) == ["batch_serialisation"]
