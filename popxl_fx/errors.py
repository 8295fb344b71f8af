"""What popxl_fx reports when a model cannot become a static PopXL program."""

from __future__ import annotations

import os
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

__all__ = ["Issue", "UnsupportedError", "user_frame"]


@dataclass(frozen=True)
class Issue:
    """One thing that stops a model from lowering, located in the user's code.

    Args:
        kind: "unsupported op", "unsupported module", "unsupported random op", "hidden state",
            ".item()", "data-dependent control flow", "data-dependent shape" or
            "data-dependent length".
        what: the op/module/expression concerned (e.g. "torch.fft.fft").
        source: the user's "file:line" ("<unknown>" when no user frame was found).
        module_path: qualified name of the torch module it happened in ('' = the root).
        node: the fx node name, when there is one.
        hint: what to do about it (nearby supported ops, how to rewrite).
    """

    kind: str
    what: str
    source: str
    module_path: str = ""
    node: str = ""
    hint: str = ""

    def __str__(self) -> str:
        where = f"module '{self.module_path}'" if self.module_path else "the root module"
        node = f", fx node '{self.node}'" if self.node else ""
        hint = f"\n    {self.hint}" if self.hint else ""
        return f"{self.source}: {self.kind}: {self.what} (in {where}{node}){hint}"


@dataclass
class UnsupportedError(Exception):
    """Raised instead of building a program when the model has `Issue`s."""

    model: str
    issues: list[Issue] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [
            f"{self.model} cannot be lowered to a static PopXL program "
            f"({len(self.issues)} issue(s)):"
        ]
        lines += [f"  {issue}" for issue in self.issues]
        return "\n".join(lines)


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_OWN_DIR = os.path.dirname(__file__) + os.sep  # popxl_fx
_STDLIB_DIR = os.path.dirname(os.__file__) + os.sep


def _internal(path: str) -> bool:
    """torch, popxl_fx and the standard library (not packages installed beside it)."""
    if path.startswith((_TORCH_DIR, _OWN_DIR)):
        return True
    return path.startswith(_STDLIB_DIR) and not any(
        part in ("site-packages", "dist-packages") for part in path.split(os.sep)
    )


def user_frame(stack: Sequence[traceback.FrameSummary] | None = None) -> str:
    """``file:line`` of the innermost frame outside torch, popxl_fx and the stdlib."""
    frames = stack if stack is not None else traceback.extract_stack()
    for frame in reversed(frames):
        if not frame.filename.startswith("<") and not _internal(os.path.abspath(frame.filename)):
            return f"{frame.filename}:{frame.lineno}"
    return "<unknown>"
