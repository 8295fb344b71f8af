"""The Session's one-time plan: memory per IPU and an estimate of cycles per run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict

from .machine import Machine

__all__ = ["Plan", "build_plan"]


@dataclass
class Plan:
    machine: Machine
    variable_bytes: Dict[int, int] = field(default_factory=dict)

    def report(self) -> Dict[str, object]:
        return {"machine": self.machine.name, "variable_bytes": dict(self.variable_bytes)}


def build_plan(ir, machine: Machine) -> Plan:
    plan = Plan(machine)
    for v in ir.main_graph.variables:
        plan.variable_bytes[v.ipu] = plan.variable_bytes.get(v.ipu, 0) + v.spec.nbytes
    return plan
