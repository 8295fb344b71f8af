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
