"""`explain`: the build pipeline as it ran for a trainer, inference model or compiled module.

It prints the `stage.Stage` records the build filled, in order: which stages (transforms)
ran and what each did, the graphs each made, and once the main graph calls the step, the
memory per IPU the simulator plans after the stage; then the program's graphs with their
op counts, code bytes and how often each runs per call. Transforms that plug into the
pipeline appear without any change here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from torch import nn

from .options import Options
from .stage import Stage

__all__ = ["Explanation", "explain"]


@dataclass
class Explanation:
    """What `explain` returns: ``str()`` of it is the text; ``programs`` the records
    (program name -> its stages; `compile` has a forward and, once used, a backward)."""

    title: str
    options: Options
    programs: dict[str, list[Stage]]

    def stage_names(self, program: str | None = None) -> list[str]:
        """The stages that ran, in order (of ``program``, default the first)."""
        stages = self.programs[program or next(iter(self.programs))]
        return [s.name for s in stages]

    def __str__(self) -> str:
        lines = [f"{self.title}, {_options(self.options)}"]
        for name, stages in self.programs.items():
            lines.append(f"{name} program: stages in order")
            lines += [_stage_line(i, s) for i, s in enumerate(stages, 1)]
            lines += _graph_table(stages[-1])
        return "\n".join(lines)


def _options(options: Options) -> str:
    default = Options()
    changed = [
        f"{f.name}={getattr(options, f.name)!r}"
        for f in dataclasses.fields(options)
        if getattr(options, f.name) != getattr(default, f.name) or f.name == "device"
    ]
    return f"Options({', '.join(changed)})"


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def _stage_line(i: int, stage: Stage) -> str:
    line = f"  {i:2d}. {stage.name:<20} {stage.detail}"
    if stage.new_graphs:
        made = ", ".join(f"{g} ({n} ops)" for g, n in stage.new_graphs.items())
        line += f"\n      new graphs: {made}"
    if stage.memory:
        per_ipu = ", ".join(f"IPU {ipu}: {_mib(b)}" for ipu, b in sorted(stage.memory.items()))
        line += f"\n      memory per IPU after it: {per_ipu}"
    return line


def _graph_table(stage: Stage) -> list[str]:
    if not stage.graphs:
        return []
    rows = ["  graphs:  ops  code bytes  runs/call  name"]
    rows += [f"        {g.ops:6d} {g.code_bytes:11d} {g.runs:10d}  {g.name}" for g in stage.graphs]
    return rows


def explain(obj: Any) -> Explanation:
    """The pipeline as it ran for ``obj``: a `training_model` trainer, an `inference_model`
    model or a module made by `compile` (after its first call)."""
    if isinstance(obj, nn.Module) and hasattr(obj.__dict__.get("forward"), "explain"):
        return obj.__dict__["forward"].explain()
    if hasattr(obj, "explain") and not isinstance(obj, nn.Module):
        return obj.explain()
    raise TypeError(
        f"explain takes what training_model, inference_model or compile returned, got "
        f"{type(obj).__name__}."
    )
