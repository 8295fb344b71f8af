"""What one entry point keeps on its `Program` is typed (`Extras`), and memory='auto' keeps
its choice apart from the options the user gave."""

import torch
import torch.nn.functional as F
from torch import nn

import popxl_fx
from popxl_fx.built import Extras
from popxl_fx.torch_state import SharedState


def _trainer(options):
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return popxl_fx.training_model(model, opt, F.cross_entropy, options)


def test_program_extras_are_named_fields():
    trainer = _trainer(popxl_fx.Options(device="cpu"))
    trainer(torch.randn(2, 4), torch.tensor([0, 2]))
    prog = trainer.build(torch.randn(2, 4), torch.tensor([0, 2]))
    assert isinstance(prog.extra, Extras)
    assert isinstance(prog.extra.shared, SharedState)
    assert prog.extra.phases is None  # not phased
    assert prog.extra.replica_feeds is not None  # made by the first step


def test_auto_returns_its_choice_and_keeps_the_given_options():
    given = popxl_fx.Options(memory="auto")
    trainer = _trainer(given)
    assert trainer.choice is None and trainer.options is given and trainer.memory_plan == ""
    trainer(torch.randn(2, 4), torch.tensor([0, 2]))
    assert trainer.given is given  # not overwritten by the choice
    assert trainer.options is trainer.choice.options == given.replace(memory={})
    assert "fits as given" in trainer.memory_plan
