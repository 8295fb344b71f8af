"""What cannot become a static graph, found while `capture.CaptureTracer` traces: values read
from tensor data (``.item()``), data-dependent shapes and lengths, control flow on tensor
values. Each is recorded as an `Issue` (one per kind and source line) and tracing goes on
with the example's concrete value, so that one pass finds every problem.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx as fx

from .capture_proxy import describe
from .errors import Issue, user_frame
from .guards import data_check, find_guard

__all__ = ["StaticChecks"]

# Ops whose output shape (or python value) depends on the tensor data.
_DATA_METHODS = frozenset({"item", "tolist", "nonzero", "masked_select", "unique", "argwhere"})
_DATA_FUNCTIONS = frozenset(
    {torch.nonzero, torch.masked_select, torch.unique, torch.argwhere, torch.unique_consecutive}
)
_DATA_HINT = {
    ".item()": "a Python number read from a tensor freezes one step's data into the graph; "
    "keep it a tensor.",
    "data-dependent shape": "its output shape depends on the data, so no static graph exists; "
    "use a fixed-size form (masking with torch.where, topk).",
    "data-dependent length": "the number of items depends on the data; pad to a fixed size.",
}


class StaticChecks:
    """The tracer's static-graph checks (a mixin of `capture.CaptureTracer`, which has the
    ``issues`` list, the module ``_paths`` and ``create_proxy``)."""

    issues: list[Issue]
    _paths: list[str]
    create_proxy: Any

    def mark_data_dependent(self, node: fx.Node) -> None:
        """Record ``node`` when its value depends on tensor data, and mark it (and what it
        feeds) so that a later check on it is recorded too."""
        if (
            node.target in _DATA_METHODS
            if node.op == "call_method"
            else node.target in _DATA_FUNCTIONS
        ) or _bool_mask_index(node):
            kind = ".item()" if node.target in ("item", "tolist") else "data-dependent shape"
            self.record(node, kind, describe(node), _DATA_HINT[kind])
            node.meta["data_dependent"] = True
        elif any(n.meta.get("data_dependent") for n in node.all_input_nodes):
            node.meta["data_dependent"] = True

    def record(self, node: fx.Node | None, kind: str, what: str, hint: str = "") -> None:
        source = user_frame()
        path = (
            node.meta.get("module_path", "")
            if node is not None
            else (self._paths[-1] if self._paths else "")
        )
        issue = Issue(kind, what, source, path, node.name if node is not None else "", hint)
        if all((i.kind, i.source) != (kind, source) for i in self.issues):
            self.issues.append(issue)

    def check_static(self, proxy: fx.Proxy, kind: str, what: str) -> None:
        if proxy.node.meta.get("data_dependent"):
            self.record(proxy.node, kind, what, _DATA_HINT[kind])

    def to_bool(self, obj: fx.Proxy) -> bool:
        value = bool(obj.node.meta["example_value"])
        guard = find_guard()
        if guard is not None:  # `if bad: raise`: a run-time check instead of a branch
            self.create_proxy(
                "call_function", data_check, (obj, value, guard.where, guard.text), {}
            )
            return value
        self.record(
            obj.node,
            "data-dependent control flow",
            f"bool({describe(obj.node)})",
            "a Python `if`/`while` on a tensor value; use torch.where or compute both branches.",
        )
        return value

    def iter(self, obj: fx.Proxy) -> Iterator:
        self.check_static(obj, "data-dependent length", f"iteration over {describe(obj.node)}")
        n = len(obj.node.meta["example_value"])
        return iter([obj[i] for i in range(n)])


def _bool_mask_index(node: fx.Node) -> bool:
    if node.op != "call_function" or node.target is not operator.getitem:
        return False
    index = fx.node.map_arg(node.args[1], lambda n: n.meta["example_value"])
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)
