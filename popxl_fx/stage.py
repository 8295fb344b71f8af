"""The records the build pipeline fills, one per stage that ran (`pipeline.Build.record`), and
`explain` prints.

They live apart from `pipeline` so that `explain` (which `program.ProgramView.explain` and the
other entry points' ``explain()`` call) reads them without importing the pipeline, which
imports `program`: no import circle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["GraphRow", "Stage"]


@dataclass(frozen=True)
class GraphRow:
    """One graph of the program after a stage: ops, code bytes and runs per call."""

    name: str
    ops: int
    code_bytes: int
    runs: int


@dataclass(frozen=True)
class Stage:
    """What one stage of the pipeline did (`explain` prints these, in order).

    ``memory`` is bytes per IPU (of one replica) planned after the stage, and ``graphs`` the
    graphs the main graph reaches then; both are empty before the step's call sites exist
    (``new_graphs`` then names the graphs the stage made, with their op counts).
    """

    name: str
    detail: str
    new_graphs: dict[str, int] = field(default_factory=dict)
    graphs: tuple[GraphRow, ...] = ()
    memory: dict[int, int] = field(default_factory=dict)
