"""`Program`: what a build of any entry point returns (`steps.build_training`,
`steps.build_inference`, `phased.build_phased_training`).

Apart from `steps` so that `phased` builds one without importing `steps`, which dispatches to
`phased`: no import circle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import addons
import popxl_core as popxl

from .optim import OptimizerProgram
from .pipeline import Lowered
from .program import Inputs, Weights
from .stage import Stage

__all__ = ["Program"]


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
    extra: dict[str, Any] = field(default_factory=dict)  # what one entry point alone needs

    @property
    def forward(self) -> addons.GraphWithNamedArgs:
        return self.lowered.forward

    @property
    def backward(self) -> addons.GraphWithNamedArgs | None:
        return self.lowered.backward
