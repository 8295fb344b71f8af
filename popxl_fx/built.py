"""`Program`: what a build of any entry point returns (`steps.build_training`,
`steps.build_inference`, `phased.build_phased_training`).

Apart from `steps` so that `phased` builds one without importing `steps`, which dispatches to
`phased`: no import circle.
"""

from __future__ import annotations

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

__all__ = ["Extras", "Program"]


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
    session: popxl.Session
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
