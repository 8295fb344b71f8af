"""The update's gradients freed when the next run starts (popxl_core/sim/defer.py): only the
time of each free moves, so a training step gives bit-identical losses and weights with and
without it; a loop body (device iterations) defers nothing, else a run would pile up one set
of gradients per iteration."""

from __future__ import annotations

import copy

import torch
from torch import nn

import popxl_fx
from popxl_core.sim import CompileOptions


def _model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(64, 3)
    )


def _trainer(model, compiler, **options):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opts = popxl_fx.Options(device="cpu", compiler=compiler, **options)
    return popxl_fx.training_model(model, opt, nn.CrossEntropyLoss(), opts)


def _sources(trainer) -> list:
    program = trainer.session._program
    return [program.main.source, *(g.source for g in program.graphs.values())]


def test_gradients_held_until_the_next_run_and_bits_unchanged():
    model = _model()
    plain = copy.deepcopy(model)
    deferring = _trainer(model, CompileOptions())
    freeing = _trainer(plain, CompileOptions(defer_release=False))
    x, y = torch.randn(2, 3, 4, 4), torch.tensor([0, 2])
    for _ in range(3):
        assert torch.equal(deferring(x, y), freeing(x, y))
    for a, b in zip(model.parameters(), plain.parameters()):
        assert torch.equal(a, b)
    held = deferring.session._program.deferred
    shapes = sorted(tuple(p.shape) for p in model.parameters())
    grads = sorted(tuple(t.shape) for t in held if t.dim() > 0)
    assert all(s in grads for s in shapes)  # one gradient per parameter, at least
    params = {p.data_ptr() for p in model.parameters()}
    assert not any(t.data_ptr() in params for t in held)  # no variable kept by reference
    assert any("DEFER.extend" in s for s in _sources(deferring))
    assert not any("DEFER" in s for s in _sources(freeing))
    before = list(held)
    deferring(x, y)  # the next run frees the last run's set and holds its own
    # (the linear layer's gradients are buffers kept between runs, variants.py; the
    # convolution's are new each run)
    assert len(held) == len(before) and any(a is not b for a, b in zip(held, before))


def test_a_loop_body_defers_nothing():
    trainer = _trainer(_model(), CompileOptions(), device_iterations=2)
    x, y = torch.randn(2, 2, 3, 4, 4), torch.tensor([[0, 2], [1, 1]])
    trainer(x, y)
    assert not any("DEFER" in s for s in _sources(trainer))
    assert trainer.session._program.deferred == []


def test_only_values_a_call_returned_are_held():
    """Adam's weight-sized intermediates, made by the update's own ops, are freed as before:
    the same values are held as under SGD (the backward's gradients, the forward's batch
    norm statistics)."""
    x, y = torch.randn(2, 3, 4, 4), torch.tensor([0, 2])
    held = []
    for make in (torch.optim.SGD, torch.optim.Adam):
        model = _model()
        opts = popxl_fx.Options(device="cpu")
        trainer = popxl_fx.training_model(
            model, make(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), opts
        )
        trainer(x, y)
        held.append(sorted(tuple(t.shape) for t in trainer.session._program.deferred))
    assert held[0] == held[1] and len(held[0]) >= len(list(_model().parameters()))
