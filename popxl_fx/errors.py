"""What popxl_fx reports when a model cannot become a static PopXL program."""

from __future__ import annotations

import functools
import linecache
import os
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType

import torch

__all__ = ["Issue", "StackPart", "UnsupportedError", "stack_part", "user_frame", "user_stack"]


@dataclass(frozen=True)
class Issue:
    """One thing that stops a model from lowering, located in the user's code.

    Args:
        kind: "unsupported op", "unsupported module", "unsupported random op", "hidden state",
            ".item()", "data-dependent control flow", "data-dependent shape" or
            "data-dependent length" or "untraced write".
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


@functools.lru_cache(maxsize=4096)
def _internal_file(filename: str) -> bool:
    """`_internal` of a code object's file name (or a pseudo-file like ``<string>``)."""
    return filename.startswith("<") or _internal(os.path.abspath(filename))


def _internal(path: str) -> bool:
    """torch, popxl_fx and the standard library (not packages installed beside it)."""
    if path.startswith((_TORCH_DIR, _OWN_DIR)):
        return True
    return path.startswith(_STDLIB_DIR) and not any(
        part in ("site-packages", "dist-packages") for part in path.split(os.sep)
    )


def user_frame(stack: Sequence[traceback.FrameSummary] | None = None) -> str:
    """``file:line`` of the innermost frame outside torch, popxl_fx and the stdlib (of
    ``stack``, or of the current stack)."""
    if stack is None:  # walk the live frames: no source lines read (once per traced node)
        frame: FrameType | None = sys._getframe(0)
        while frame is not None:
            if not _internal_file(frame.f_code.co_filename):
                return f"{frame.f_code.co_filename}:{frame.f_lineno}"
            frame = frame.f_back
        return "<unknown>"
    for summary in reversed(stack):
        name = summary.filename
        if not name.startswith("<") and not _internal(os.path.abspath(name)):
            return f"{name}:{summary.lineno}"
    return "<unknown>"


@dataclass(frozen=True)
class StackPart:
    """What `user_stack` needs of a run of frames (outermost first): whether one is a
    ``forward``, the user's frames from the first such on, and the innermost user frame."""

    has_forward: bool
    kept: list[traceback.FrameSummary]
    source: str | None


def _summary(f: FrameType) -> traceback.FrameSummary:
    return traceback.FrameSummary(
        f.f_code.co_filename, f.f_lineno, f.f_code.co_name, lookup_line=False
    )


def _part(frames: list[FrameType]) -> StackPart:
    start = next((i for i, f in enumerate(frames) if f.f_code.co_name == "forward"), None)
    tail = frames[start:] if start is not None else []
    ours = [f for f in tail if not _internal_file(f.f_code.co_filename)]
    users = (f for f in reversed(frames) if not _internal_file(f.f_code.co_filename))
    source = next((f"{f.f_code.co_filename}:{f.f_lineno}" for f in users), None)
    return StackPart(start is not None, [_summary(f) for f in ours], source)


def _frames(frame: FrameType | None, stop: FrameType | None = None) -> list[FrameType]:
    """``frame`` and its callers up to ``stop`` (not included), outermost first."""
    frames = []
    while frame is not None and frame is not stop:
        frames.append(frame)
        frame = frame.f_back
    frames.reverse()  # outermost first, as tracebacks print
    return frames


def stack_part(anchor: FrameType) -> StackPart:
    """The `StackPart` of ``anchor`` and its callers, for `user_stack` calls made while
    ``anchor`` runs: its callers wait for it, so their frames' lines stay as they are."""
    return _part(_frames(anchor))


def user_stack(anchor: FrameType | None = None, outer: StackPart | None = None) -> tuple[str, str]:
    """`user_frame` and the user's part of the stack as text (from the outermost ``forward``
    in, without torch's, popxl_fx's or the standard library's frames: what a traced node
    keeps as ``node.stack_trace``), from one walk of the live frames; only the kept frames'
    source lines are read. With ``outer`` (`stack_part` of ``anchor``, a frame on the stack,
    such as a trace's root call), the frames from ``anchor`` out are not walked again."""
    frames = _frames(sys._getframe(1), anchor if outer is not None else None)
    if outer is None or not frames or frames[0].f_back is not anchor:  # the whole stack
        part = _part(frames if outer is None else _frames(sys._getframe(1)))
    elif outer.has_forward:  # the outermost forward is outside: each user frame inside is kept
        inside = [f for f in frames if not _internal_file(f.f_code.co_filename)]
        source = f"{inside[-1].f_code.co_filename}:{inside[-1].f_lineno}" if inside else None
        part = StackPart(True, outer.kept + [_summary(f) for f in inside], source or outer.source)
    else:
        part = _part(frames)
        part = StackPart(part.has_forward, part.kept, part.source or outer.source)
    return part.source or "<unknown>", "".join(_Stack(part.kept).format()).strip()


class _Stack(traceback.StackSummary):
    """`traceback.StackSummary` whose frames' text is formatted once per frame (file, line,
    function) while linecache holds the same entry for the file: a traced model's nodes share
    most frames (the outer forwards' calls), and formatting them was ~15 % of a capture."""

    # (file, line, function) -> (the linecache entry the text was read from, the text)
    _texts: dict[tuple, tuple] = {}

    def format_frame_summary(self, frame_summary: traceback.FrameSummary) -> str:
        key = (frame_summary.filename, frame_summary.lineno, frame_summary.name)
        held = self._texts.get(key)
        entry = linecache.cache.get(frame_summary.filename)
        # the text depends on the key and the file's lines: the same entry object (linecache
        # makes a new one when it reads the file again) means the same lines
        if held is not None and entry is not None and held[0] is entry:
            return held[1]
        text = super().format_frame_summary(frame_summary)
        entry = linecache.cache.get(frame_summary.filename)
        if entry is not None and len(self._texts) < _TEXTS_HELD:
            self._texts[key] = (entry, text)
        return text


_TEXTS_HELD = 8192  # frames whose text is kept (a bound: generated code's frames come and go)
