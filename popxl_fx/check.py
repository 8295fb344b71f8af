"""`popxl_fx.check`: everything that stops a model from becoming one static PopXL program,
found before any IR is built, each with the user's file:line and module path.

It reports what the capture records while tracing (``.item()``, control flow on tensor
values, data-dependent shapes and list lengths), targets with no lowering and no ATen
decomposition, shapes that change with the data (the traced graph re-run on other data) and
shapes that change between calls (the model traced twice).

When the second trace runs: only when `outside_state.reads_outside_state` cannot prove that
forward's Python reads nothing but the model and constants (asked once, when the model is
captured and before its forward runs: `Captured.outside_state`; the first trace keeps the leaf
modules' states a second trace compares only then). Everything forward changes inside
the model (attributes, their lists/dicts/sets, a leaf module's configuration, a replaced
parameter or tensor) the first trace already reports ("Python state in forward", "hidden
state") and puts back, so a second trace starts where the first did and retraces the same
program. Evidence: with the second trace skipped always, the fx, check, replay, capture and
misuse tests (225) failed in exactly two places, both a module-level ``itertools.count`` read
by ``forward`` (tests/test_fx_check.py ``Counter``, tests/test_fx_inference.py ``Growing``),
which the scan keeps the trace for; `tests/test_fx_outside_state.py` lists what else keeps it
(a global list, a closure's cell, ``random``, ``time``, a held iterator, a global write). On
the fx test files the second trace now runs in 84 of 2,081 checks (it ran in all 2,079), HF
models among them (their modules read mutable registries); the scan costs ~0.2 ms a model.

The run on other data runs only where some op's output shape could depend on the data
(`check_shapes`): on eight fx test files it ran in 28 of 648 checks (~3 ms each).
"""

from __future__ import annotations

import dataclasses
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from . import (
    lowerings,  # noqa: F401  (registers the table)
    trace_patch,
)
from .calls import POSITIONAL, Binding, bind
from .capture import Captured, CaptureTracer, preserved, settle_first_call_flags, trace_module
from .capture_state import trace_graph
from .check_shapes import shapes_static
from .checks import dtype_issues
from .errors import Issue, UnsupportedError, user_frame
from .fallback import decomposition_issue
from .inplace import base_chain, inplace_state_issues, inplace_view_issues, mutated_input
from .lowering import lookup
from .outside_state import reads_outside_state
from .replay import Replay

__all__ = ["CheckReport", "all_issues", "check", "check_captured"]


@dataclass
class CheckReport:
    """The issues `check` found (empty when the model lowers)."""

    model: str
    issues: list[Issue] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.issues

    def raise_if_any(self) -> None:
        """Raise `UnsupportedError` with every issue, if there is any."""
        if self.issues:
            raise UnsupportedError(self.model, list(self.issues))

    def __str__(self) -> str:
        if self.ok:
            return f"{self.model}: no issues; it lowers to a static PopXL program."
        return str(UnsupportedError(self.model, list(self.issues)))


def check(model: nn.Module, *example_inputs: Any, **example_kwargs: Any) -> CheckReport:
    """Report every unsupported op/module and static-graph violation of ``model``, called as
    ``model(*example_inputs, **example_kwargs)`` (keyword tensors are inputs, other keyword
    values constants, and the parameters left out keep their defaults: `calls.bind`).

    The model's buffers and the torch RNG are left as they were.

    Example:
        >>> report = popxl_fx.check(model, torch.randn(2, 3))  # doctest: +SKIP
        >>> report.raise_if_any()  # doctest: +SKIP
    """
    with trace_patch.kept_patches():  # its traces patch nn.Module once (`trace_patch`)
        return _checked(model, *bind(example_inputs, example_kwargs))


def _checked(model: nn.Module, example_inputs: tuple, binding: Binding) -> CheckReport:
    report = CheckReport(type(model).__name__)
    report.issues += dtype_issues(model, example_inputs)
    if report.issues:  # the trace would only fail on the same dtypes
        return report
    first = _trace(model, example_inputs, report, binding=binding)
    if first is not None:
        report.issues += all_issues(first, model)
    return report


def all_issues(captured: Captured, model: nn.Module) -> list[Issue]:
    """`check_captured`, plus shapes that change between calls (a second trace) or with the
    data (the graph re-run on other inputs)."""
    issues = check_captured(captured, model)
    second = _retrace(captured, model) if captured.outside_state else None
    found = [_rerun_with_other_data(captured.gm, model, captured.example_inputs)]
    if second is not None:
        found.insert(0, _compare(captured.gm.graph, second, "between calls"))
    for issue in found:
        if issue is not None and all(i.source != issue.source for i in issues):
            issues.append(issue)
    return issues


def check_captured(captured: Captured, model: nn.Module) -> list[Issue]:
    """The capture's own issues plus every call with no lowering and no decomposition."""
    issues = list(captured.issues) + inplace_view_issues(captured.gm, model)
    issues += inplace_state_issues(captured.gm, model)
    verdicts: dict[tuple, Issue | None] = {}  # one decomposition per kind of call
    for node in captured.gm.graph.nodes:
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        if node.meta.get("data_dependent"):
            continue  # reported where the data dependence starts
        module = model.get_submodule(node.target) if node.op == "call_module" else None
        if lookup(type(module) if module is not None else node.target) is not None:
            continue
        key = _call_key(node, module)
        if key not in verdicts:
            verdicts[key] = decomposition_issue(node, model)
        verdict = verdicts[key]
        if verdict is not None:
            issues.append(
                dataclasses.replace(
                    verdict,
                    source=node.meta.get("source", "<unknown>"),
                    module_path=node.meta.get("module_path", ""),
                    node=node.name,
                )
            )
    return issues


def _call_key(node: fx.Node, module: nn.Module | None) -> tuple:
    """Calls with equal keys decompose alike: same target/module config, shapes and dtypes."""

    def spec(v: Any) -> Any:
        return (tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else repr(v)

    args = fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("example_value"))
    leaves = [spec(v) for v in torch.utils._pytree.tree_leaves(args)]
    what = repr(module) if module is not None else (node.op, node.target)
    return (str(what), tuple(map(str, leaves)))


def _trace(
    model: nn.Module,
    inputs: Sequence[Any],
    report: CheckReport,
    replay: Replay | None = None,
    binding: Binding = POSITIONAL,
) -> Captured | None:
    """Capture, turning an exception while tracing into an issue at the user's line."""
    outside = replay is not None or reads_outside_state(model, inputs)
    tracer = CaptureTracer(model, inputs, replay=replay, binding=binding, keep_state=outside)
    try:
        gm = trace_module(tracer, model)
        if replay is None:
            settle_first_call_flags(tracer, gm, model)
    except Exception as exc:  # the report says what failed, and where
        report.issues += tracer.issues
        message = str(exc).splitlines()[0] if str(exc) else ""
        report.issues.append(
            Issue(
                "untraceable",
                f"{type(exc).__name__}: {message}"[:300],
                user_frame(traceback.extract_tb(exc.__traceback__)),
                tracer._paths[-1] if tracer._paths else "",
                "",
                "torch.fx cannot trace this code; rewrite it with tensor ops.",
            )
        )
        return None
    return Captured(gm, tracer.issues, None, tuple(inputs), tracer.out_spec, binding, outside)


def _retrace(captured: Captured, model: nn.Module) -> fx.Graph | None:
    """The second trace's graph (None if it fails: the first trace's issues stand). It reuses
    the first one's values wherever the call is provably the same, and is only compared, so
    it makes no GraphModule and keeps none of its own issues."""
    replay = Replay(captured.gm.graph)
    tracer = CaptureTracer(model, captured.example_inputs, replay=replay, binding=captured.binding)
    try:
        return trace_graph(tracer, model)
    except Exception:  # as an untraceable first trace, but nothing to report
        return None


def _shape(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return tuple(value.shape)
    if isinstance(value, (tuple, list)):
        return tuple(_shape(v) for v in value)
    return None


def _compare(first: fx.Graph, second: fx.Graph, when: str) -> Issue | None:
    """An issue at the first node whose shape differs between two traces/runs."""
    for a, b in zip(first.nodes, second.nodes):
        before, after = _shape(a.meta.get("example_value")), _shape(b.meta.get("example_value"))
        if a.target != b.target or before != after:
            return _shape_issue(b, f"{_name(b)} has shape {after}, was {before}", when)
    if len(first.nodes) != len(second.nodes):
        last = list(second.nodes)[-1]
        return _shape_issue(last, "the traced graph changed", when)
    return None


def _shape_issue(node: fx.Node, what: str, when: str) -> Issue:
    return Issue(
        "shape changes " + when,
        what,
        node.meta.get("source", "<unknown>"),
        node.meta.get("module_path", ""),
        node.name,
        "a static PopXL program has one shape per tensor; keep shapes independent of "
        "the data and of how many times the model ran.",
    )


def _name(node: fx.Node) -> str:
    if node.op == "call_method":
        return f"Tensor.{node.target}()"
    return f"{getattr(node.target, '__name__', node.target)}()" if node.op != "output" else "output"


def _other_data(x: Any) -> Any:
    """Other values of the same shape/dtype (integers stay within the example's range)."""
    if not isinstance(x, torch.Tensor):
        return x
    gen = torch.Generator().manual_seed(1234)
    if x.dtype == torch.bool:
        return torch.rand(x.shape, generator=gen) > 0.5
    if x.is_floating_point():
        return (torch.randn(x.shape, generator=gen) * 2 + 0.5).to(x.dtype)
    low, high = (int(x.min()), int(x.max()) + 1) if x.numel() else (0, 1)
    return torch.randint(low, high, x.shape, generator=gen, dtype=x.dtype)


class _ShapeRecorder(fx.Interpreter):
    def run_node(self, n: fx.Node) -> Any:
        value = super().run_node(n)
        self.shapes[n] = _shape(value)
        return value

    def fetch_attr(self, target: str) -> Any:
        value = super().fetch_attr(target)
        # a tensor forward makes (folded to a constant) is new on every eager call: forward
        # may update it in place
        return value.clone() if target.startswith("_tensor_constant") else value


def _updated_in_place(gm: fx.GraphModule, model: nn.Module) -> set[fx.Node]:
    """The nodes whose tensors a later node updates in place (and the tensors they view)."""
    targets = [mutated_input(n, model) for n in gm.graph.nodes if n.op != "output"]
    return {b for t in targets if t is not None for b in base_chain(t)}


def _rerun_with_other_data(
    gm: fx.GraphModule, model: nn.Module, inputs: Sequence[Any]
) -> Issue | None:
    """The traced graph run on other data: an issue at the first node whose shape changes.
    Not run where no node's shape can depend on the data (`check_shapes`)."""
    if shapes_static(gm, model):
        return None
    recorder = _ShapeRecorder(gm)
    recorder.shapes = {}
    try:
        with preserved(model), torch.no_grad():
            recorder.run(*[_other_data(x) for x in inputs])
    except Exception:  # other data may be invalid for the model; no verdict
        pass
    updated = _updated_in_place(gm, model)
    for node, shape in recorder.shapes.items():
        if node in updated:  # its example value took a later in-place update (``squeeze_``)
            continue
        if node.op != "output" and shape != _shape(node.meta.get("example_value")):
            before = _shape(node.meta.get("example_value"))
            return _shape_issue(
                node,
                f"{_name(node)} has shape {shape} on other data, {before} on the example",
                "with the data",
            )
    return None
