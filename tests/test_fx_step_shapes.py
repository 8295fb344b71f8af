"""`steps.build_training` is one builder given the step's shape (`built.StepShape`): it
checks the inputs, enters the main graph and makes the `Program` once, and asks the shape
for the rest, in a fixed order."""

import importlib
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import addons
import popxl_fx
from popxl_fx import lower_stage, steps
from popxl_fx.optim import OptimizerProgram
from popxl_fx.phased import PhasedShape
from popxl_fx.step_loops import LoopShape
from popxl_fx.steps import PlainShape, shape_of


def test_the_options_pick_the_shape():
    Options = popxl_fx.Options
    assert type(shape_of(Options())) is PlainShape
    for loops in ("gradient_accumulation", "device_iterations", "batch_serialisation"):
        assert type(shape_of(Options(**{loops: 2}))) is LoopShape
    assert type(shape_of(Options(phased_execution="children"))) is PhasedShape


class _Recorded(PlainShape):
    """The plain shape, recording which of its hooks the builder calls, in order."""

    def __init__(self, calls: list) -> None:
        self.calls = calls

    def refuse(self, build, req):
        self.calls.append("refuse")
        return super().refuse(build, req)

    def step_inputs(self, build, req):
        self.calls.append("step_inputs")
        return super().step_inputs(build, req)

    def capture(self, build, req, step_inputs):
        self.calls.append("capture")
        return super().capture(build, req, step_inputs)

    def build(self, build, req, step_inputs, captured):
        self.calls.append("build")
        return super().build(build, req, step_inputs, captured)


def _losses(options):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))
    trainer = popxl_fx.training_model(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                      F.cross_entropy, options)  # fmt: skip
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(4, 4, generator=g), torch.randint(0, 3, (4,), generator=g))]
    return torch.stack([trainer(x, y) for x, y in batches * 3])


def test_the_builder_asks_the_shape_it_is_given_in_order(monkeypatch):
    options = popxl_fx.Options(device="cpu")
    plain = _losses(options)
    calls: list = []
    monkeypatch.setattr(steps, "shape_of", lambda opts: _Recorded(calls))
    assert torch.equal(_losses(options), plain)  # bit for bit: the same program
    assert calls == ["refuse", "step_inputs", "capture", "build"]  # one build, 3 steps


# the module, not the function that `addons.transforms` exports under its name
autodiff_module = importlib.import_module("addons.transforms.autodiff")
SHAPES = {
    "plain": {},
    "loops": {"gradient_accumulation": 2},
    "phased": {"phased_execution": "children"},
    "phased_sliced": {"phased_execution": "children", "gradient_accumulation": 2},
    "phased_replicated": {"phased_execution": "children", "replication_factor": 2},
}


def _caller_names(frame, depth: int) -> set:
    """The function names of ``frame`` and the ``depth - 1`` frames that called it."""
    names = set()
    for _ in range(depth):
        if frame is None:
            break
        names.add(frame.f_code.co_name)
        frame = frame.f_back
    return names


def _callers(calls: list, fn):
    """``fn`` recording, per call, the names of the functions on the stack that called it.

    The frames are walked directly: ``inspect.stack()`` also finds each frame's source file
    and lines (its module, through every loaded module), which took a third of this file's
    CPU time."""

    def recorded(*args, **kwargs):
        calls.append(_caller_names(sys._getframe(1), 11))
        return fn(*args, **kwargs)

    return recorded


@pytest.mark.parametrize("shape", SHAPES)
def test_every_shape_lowers_differentiates_and_updates_through_the_shared_stages(
    monkeypatch, shape
):
    """Each shape's graphs are made by the shared stages (issue 39): every traced module by
    `lower_stage._module`, every gradient graph by `lower_stage.gradient_graph`, every
    optimizer update by `step_parts.update_parameters` (the phased shape once per phase)."""
    made, grads, updates = [], [], []
    monkeypatch.setattr(lower_stage, "_module", _callers(made, lower_stage._module))
    monkeypatch.setattr(addons, "autodiff", _callers(grads, addons.autodiff))
    # autodiff_with_accumulation calls its own module's autodiff
    monkeypatch.setattr(autodiff_module, "autodiff", _callers(grads, autodiff_module.autodiff))
    monkeypatch.setattr(OptimizerProgram, "build", _callers(updates, OptimizerProgram.build))
    _losses(popxl_fx.Options(device="cpu", **SHAPES[shape]))
    assert made and grads and updates
    assert all("gradient_graph" in callers for callers in grads)
    assert all("update_parameters" in callers for callers in updates)
    if shape.startswith("phased"):  # a piece per child and the loss's; an update per Linear
        assert (len(made), len(updates)) == (4, 2)
