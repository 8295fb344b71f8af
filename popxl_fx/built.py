"""`Program`: what a build of any entry point returns (`steps.build_training`,
`steps.build_inference`); `StepShape`: the shape of a training step (plain, loops, phases)
that `steps.build_training` is given, and `BuiltStep`, what a shape builds.

Apart from `steps` so that `phased` and `step_loops` define their shapes without importing
`steps`, which picks among them: no import circle.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import addons
import popxl_core as popxl

from .optim import OptimizerProgram
from .pipeline import Lowered
from .program import Inputs, Weights
from .stage import Stage

if TYPE_CHECKING:  # annotations only: these modules build on `Program`'s
    from .phase_report import PhaseSteps
    from .replication import ReplicaFeeds
    from .torch_state import SharedState

__all__ = ["BuiltStep", "Extras", "Program", "StepShape"]


@dataclass
class Extras:
    """What one entry point alone keeps on its `Program` (each None until it is made)."""

    shared: SharedState | None = None  # training_model: the state shared with torch
    phases: PhaseSteps | None = None  # phased training: per phase, for `Trainer.report`
    replica_feeds: ReplicaFeeds | None = None  # the optimizer feeds' layout (first step)


@dataclass
class Program:
    """One built program of any entry point.

    ``outputs`` are the device-to-host streams by name: "loss" (training), "output.<i>" (the
    forward's flattened outputs), "grad.<name>" (training with ``record``).
    """

    signature: Any
    ir: popxl.Ir
    session: popxl.Session | None  # None: a plan-only build (`Build.plan_only`)
    inputs: Inputs
    outputs: dict[str, popxl.DeviceToHostStream]
    weights: Weights
    lowered: Lowered
    stages: list[Stage]
    optim: OptimizerProgram | None = None
    extra: Extras = field(default_factory=Extras)

    @property
    def forward(self) -> addons.GraphWithNamedArgs:
        return self.lowered.forward

    @property
    def backward(self) -> addons.GraphWithNamedArgs | None:
        return self.lowered.backward


@dataclass
class BuiltStep:
    """What a `StepShape` built in the main graph: `steps.build_training` makes the
    `Program` of it."""

    inputs: Inputs  # the host-to-device streams of one step's inputs (the first loaded)
    outputs: dict[str, popxl.DeviceToHostStream]
    weights: Weights
    lowered: Lowered
    extra: Extras = field(default_factory=Extras)


class StepShape(ABC):
    """The shape of a training step, as `steps.build_training` asks for it, in this order:
    `refuse` before any input check, `step_inputs` after the common ones, `capture` outside
    the main graph, `build` in it (in sequence). The defaults are the plain step's."""

    def refuse(self, build: Any, req: Any) -> None:
        """Raise for what this shape does not do (before the inputs are checked)."""
        return None  # the plain step refuses nothing beyond `refusals`' entry rows

    def step_inputs(self, build: Any, req: Any) -> tuple:
        """Check ``req.inputs`` against the shape; one step's torch inputs."""
        return tuple(req.inputs)

    def capture(self, build: Any, req: Any, step_inputs: tuple) -> Any:
        """What the shape traces before the main graph is entered (None: it traces in
        `build`)."""
        return None

    @abstractmethod
    def build(self, build: Any, req: Any, step_inputs: tuple, captured: Any) -> BuiltStep:
        """Lower, differentiate, update and store in the main graph."""
