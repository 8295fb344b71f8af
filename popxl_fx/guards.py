"""Checks that only raise on bad data, kept as run-time checks.

HF models guard their inputs: ``if labels.max() >= vocab: raise ValueError(...)``. A static
program cannot branch on data, but a branch whose only statement is ``raise`` (or an
``assert`` on a tensor) needs no branch: the program goes on the path the capture took, and
a run-time check (`popxl_core.ops.runtime_check`, as torch.export's ``torch._check``) stops
the step when the data would have taken the other one. The entry points then give the
model's own error: they run the model eagerly on the same batch (`raise_model_error`), which
raises it at the model's line, with its message. A real data-dependent branch (one that
computes something) is still refused by capture, with its line.

A test with ``and``/``or`` is a guard only where the one ``bool`` decides it (`find_guard`):
HF's ``if labels is not None and labels.max() >= vocab: raise`` is.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch
from torch import nn

from popxl_core.ops import RuntimeCheckError

from .errors import _internal_file

__all__ = ["Guard", "data_check", "find_guard", "raise_model_error"]


@dataclass(frozen=True)
class Guard:
    """A test at ``where`` (file:line) whose failing side only raises: ``text`` its source."""

    where: str
    text: str


def data_check(cond: Any, passed: bool, where: str, text: str) -> None:
    """The graph's marker of a guard (`Guard`'s fields as plain arguments, which fx keeps):
    ``bool(cond)`` must stay ``passed`` (the value the capture saw); lowered to a run-time
    check. Run as Python (a graph module re-run on other
    data) it checks nothing: the lowered program does."""
    return None


def find_guard() -> Guard | None:
    """The guard whose test the user's code is converting to bool now, if the statement is
    ``if <test>: raise ...`` (no else) or ``assert <test>``. A test of ``and``/``or`` is one
    where this bool decides it alone: any operand of an ``or`` (the statement raises if any
    is true), the last operand of an ``and`` (the earlier ones were true to get here; a
    tensor among them was refused at its own bool)."""
    frame = _user_frame()
    if frame is None:
        return None
    tree = _parsed(frame.f_code.co_filename)
    if tree is None:
        return None
    where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
    at = _position(frame)
    for node in ast.walk(tree):
        test = _guarded_test(node)
        if test is not None and _spans(test, frame.f_lineno):
            return Guard(where, ast.unparse(test)) if _decides(test, at) else None
    return None


def _guarded_test(node: ast.AST) -> ast.expr | None:
    if isinstance(node, ast.Assert):
        return node.test
    if isinstance(node, ast.If) and not node.orelse and node.body:
        if all(isinstance(s, ast.Raise) for s in node.body):
            return node.test
    return None


def _decides(test: ast.expr, at: tuple | None) -> bool:
    """This bool (at source position ``at``) alone decides whether ``test`` raises."""
    if not isinstance(test, ast.BoolOp):
        return not any(isinstance(n, ast.BoolOp) for n in ast.walk(test))
    if any(isinstance(n, ast.BoolOp) for v in test.values for n in ast.walk(v)):
        return False
    operands = test.values if isinstance(test.op, ast.Or) else test.values[-1:]
    return at is not None and any(at == _span(v) for v in operands)


def _span(node: ast.expr) -> tuple:
    return (node.lineno, node.end_lineno, node.col_offset, node.end_col_offset)


def _spans(test: ast.expr, lineno: int) -> bool:
    return test.lineno <= lineno <= (test.end_lineno or test.lineno)


def _position(frame: FrameType) -> tuple | None:
    """The source span of the instruction the frame is running (the jump testing a value)."""
    positions = list(frame.f_code.co_positions())
    index = frame.f_lasti // 2
    return tuple(positions[index]) if 0 <= index < len(positions) else None


def _user_frame() -> FrameType | None:
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and _internal_file(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


@functools.lru_cache(maxsize=64)
def _parsed(filename: str) -> ast.Module | None:
    try:
        with open(filename, encoding="utf-8") as f:
            return ast.parse(f.read(), filename)
    except (OSError, SyntaxError, ValueError):
        return None


def raise_model_error(run: Callable[[], Any], model: nn.Module, failed: RuntimeCheckError) -> None:
    """Raise the error that ``run`` (the model's eager forward, and its loss, on the batch
    whose check ``failed`` in the program) raises: run without gradients, ``model``'s buffers
    and torch's RNG left as they were. Where eager does not raise, ``failed`` is raised."""
    try:
        with torch.no_grad(), torch.random.fork_rng(), _buffers_kept(model):
            run()
    except Exception as exc:  # the model's own error, whatever its type
        exc.add_note(f"(the model's check at {failed.tag} failed on this batch)")
        raise exc from None
    raise failed


@contextlib.contextmanager
def _buffers_kept(model: nn.Module) -> Iterator[None]:
    saved = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, value in saved:
                b.copy_(value)
