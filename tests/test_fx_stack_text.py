"""A traced node's ``stack_trace`` is the text `traceback` formats for the user's frames; the
frames' text, formatted once per frame, follows the source file when linecache reads it
again."""

from __future__ import annotations

import importlib.util
import linecache
import sys
import traceback

import torch

from popxl_fx.capture import capture
from popxl_fx.errors import stack_part, user_stack

_SOURCE = """
import torch
from torch import nn


class Scaled(nn.Module):
    def forward(self, x):
        return x * 2  # {mark}
"""


def _load(path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _stack(model) -> str:
    gm = capture(model, (torch.randn(2),)).gm
    [mul] = [n for n in gm.graph.nodes if n.op == "call_function"]
    return mul.stack_trace


def test_a_nodes_stack_text_is_tracebacks_and_follows_the_source(tmp_path):
    path = tmp_path / "scaled_model.py"
    path.write_text(_SOURCE.format(mark="first"))
    model = _load(path, "scaled_model").Scaled()
    try:
        first = _stack(model)
        summary = traceback.FrameSummary(str(path), 8, "forward")
        assert first == "".join(traceback.StackSummary.from_list([summary]).format()).strip()
        assert first.endswith("return x * 2  # first") and _stack(model) == first
        path.write_text(_SOURCE.format(mark="second"))  # the same line, other text
        linecache.checkcache(str(path))  # as traceback does before it prints
        assert _stack(model).endswith("return x * 2  # second")
    finally:
        sys.modules.pop("scaled_model", None)


class Blocks(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())

    def forward(self, x):
        return self.layers(x * 2).sum(dim=-1)


def _stacks(model, x) -> list:
    gm = capture(model, (x,)).gm
    return [(n.name, n.meta["source"], n.stack_trace) for n in gm.graph.nodes if n.op != "output"]


def forward(f):  # a user function named forward that captures (the outermost forward)
    return f()


def test_a_trace_reads_the_frames_outside_its_root_call_once(monkeypatch):
    import popxl_fx.capture_calls as calls_module

    model, x = Blocks(), torch.randn(2, 3)
    parts = []
    monkeypatch.setattr(calls_module, "stack_part", lambda f: parts.append(f) or stack_part(f))
    inner, outer = _stacks(model, x), forward(lambda: _stacks(model, x))
    assert len(parts) == 2  # once per trace
    assert [s[:2] for s in inner] == [s[:2] for s in outer]  # the same innermost user lines
    assert all("in forward\n    return f()" in s[2] for s in outer[1:])  # outer forward kept
    assert not any("return f()" in (s[2] or "") for s in inner)


def _below(n: int, anchor, outer) -> tuple:
    if n:
        return _below(n - 1, anchor, outer)
    return user_stack(anchor, outer), user_stack()  # one line: the same frames


def _anchored(n: int) -> tuple:
    anchor = sys._getframe(0)
    return _below(n, anchor, stack_part(anchor))


def _forward_then_anchor() -> tuple:
    def forward():
        return _anchored(2)

    return forward()


def _anchor_then_forward() -> tuple:
    anchor = sys._getframe(0)
    outer = stack_part(anchor)

    def forward():
        return _below(2, anchor, outer)

    return forward()


def test_a_stack_read_from_an_anchor_is_the_whole_walks():
    for with_anchor, walked in (_forward_then_anchor(), _anchor_then_forward(), _anchored(1)):
        assert with_anchor == walked
    assert "in forward" in _forward_then_anchor()[0][1]
    assert "_anchor_then_forward" not in _anchor_then_forward()[0][1]  # kept from forward in
