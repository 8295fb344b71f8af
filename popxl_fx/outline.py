"""Outlining a traced model: repeated identical submodules become one graph called N times.

`plan_outline` decides which submodules outline and traces the model once more with those
submodules as leaves (one ``call_module`` node per call site). Call sites whose module has the
same class, parameter/buffer names, shapes and dtypes, train modes, input specs and traced code
(constants included) form one `Group`: one `popxl_fx.Module` builds the block graph once
(``GraphCache``), and every call site binds its own variables to it, as
``addons.Module.call_module`` does (`popxl_fx.Module` lowers the sites).

``outline="auto"`` picks the outermost traced-through (non-leaf) submodules that occur at
least twice with the same structure; a list of names or classes picks those. A call site can
outline when its inputs are tensors passed positionally, its module shares no tensor with the
rest of the model and its forward writes none of its inputs in place; "auto" inlines the others,
a list raises naming the module and the reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.fx as fx
from torch import nn

from . import trace_patch
from .calls import POSITIONAL, Binding
from .capture import Captured, CaptureTracer, capture, is_leaf, preserved, trace_module
from .capture_effects import WARN_KINDS
from .inplace import mutated_input

__all__ = ["Group", "OutlineError", "OutlinePlan", "candidates", "plan_outline"]


@dataclass
class Group:
    """Call sites that share one block graph.

    Attributes:
        label: the module path with the varying part as ``*`` (``"blocks.*"``); names the
            block's ops in reports.
        sites: call-site fx node name -> module path, in call order.
        representative: the module whose capture builds the graph (the first site's).
        captured: that capture.
    """

    label: str
    sites: dict[str, str]
    representative: nn.Module
    captured: Captured
    builder: Any = None  # the popxl_fx.Module of the block graph (made by the lowering)
    n_outputs: Any = None  # block graph -> its outputs before autodiff added any

    @property
    def paths(self) -> list[str]:
        return list(dict.fromkeys(self.sites.values()))


@dataclass
class OutlinePlan:
    """The model traced with the outlined modules as leaves, and the groups of its call sites."""

    gm: fx.GraphModule
    groups: list[Group] = field(default_factory=list)

    def group_of(self, node_name: str) -> Group | None:
        return next((g for g in self.groups if node_name in g.sites), None)

    def describe(self) -> list[str]:
        return [
            f"{g.label}: one graph, {len(g.sites)} calls ({', '.join(g.paths)})"
            for g in self.groups
        ]


class OutlineError(ValueError):
    """An ``outline=`` entry that cannot be honoured."""


# which modules ----------------------------------------------------------------------------
def _structure(module: nn.Module) -> tuple:
    """What two modules must share to run the same code on different weights."""
    tensors = [*module.named_parameters(), *module.named_buffers()]
    return (
        type(module),
        tuple((n, tuple(t.shape), t.dtype, t.requires_grad) for n, t in tensors),
        tuple(m.training for m in module.modules()),
    )


def candidates(root: nn.Module) -> dict[tuple, list[str]]:
    """Structure -> paths of the submodules with children (traced-through modules, and
    composite torch.nn layers such as ``nn.TransformerEncoderLayer``) that occur at least
    twice."""
    found: dict[tuple, list[str]] = {}
    for path, m in root.named_modules():
        if path and (not is_leaf(m) or any(True for _ in m.children())):
            found.setdefault(_structure(m), []).append(path)
    return {k: v for k, v in found.items() if len(v) >= 2}


def _outermost(paths: Iterable[str]) -> list[str]:
    chosen = sorted(set(paths), key=lambda p: (p.count("."), p))
    kept: list[str] = []
    for p in chosen:
        if not any(p.startswith(k + ".") for k in kept):
            kept.append(p)
    return kept


def _candidate_text(root: nn.Module) -> str:
    repeated = [
        f"{paths[0]}..{paths[-1]} ({k[0].__name__})" for k, paths in candidates(root).items()
    ]
    return ", ".join(repeated) if repeated else "none (no submodule repeats)"


def _listed(root: nn.Module, spec: tuple, prefix: str) -> list[str]:
    """Paths of the modules a list names; raises for an entry matching none."""
    modules = dict(root.named_modules())
    paths: list[str] = []
    for item in spec:
        if isinstance(item, str):
            found = [prefix + item] if prefix + item in modules and item else []
        else:
            found = [p for p, m in modules.items() if p and type(m) is item]
        if not found:
            name = item if isinstance(item, str) else item.__name__
            raise OutlineError(
                f"Options(outline=...): {name!r} matches no submodule of the model. Repeated "
                f"submodules that could outline: {_candidate_text(root)}; or give a name from "
                "model.named_modules() or a module class."
            )
        paths += found
    kept = _outermost(paths)
    nested = sorted(set(paths) - set(kept))
    if nested:
        raise OutlineError(
            f"Options(outline=...): {nested[0][len(prefix) :]!r} is inside another outlined "
            "module; nested outlining is not supported: list the outer or the inner modules."
        )
    return kept


# the plan ---------------------------------------------------------------------------------
def plan_outline(
    root: nn.Module,
    spec: str | tuple,
    examples: tuple,
    prefix: str = "",
    binding: Binding = POSITIONAL,
) -> OutlinePlan:
    """Which call sites of ``root`` outline, and the leaf trace that calls them.

    Args:
        spec: ``"auto"`` or a tuple of module names (relative to ``prefix``) and classes.
        examples: the torch inputs the model was captured with.
        prefix: where the user's model sits in ``root`` (the loss wrapper's ``"model."``).
    """
    with trace_patch.kept_patches():  # its traces (leaf trace, each site's) patch nn.Module once
        return _planned(root, spec, examples, prefix, binding)


def _planned(
    root: nn.Module, spec: str | tuple, examples: tuple, prefix: str, binding: Binding
) -> OutlinePlan:
    strict = spec != "auto"
    repeated = [p for group in candidates(root).values() for p in group]
    excluded: set[str] = set()
    for _ in range(_ROUNDS):
        # "auto": the outermost repeated modules not excluded yet (the submodules of one that
        # cannot outline get their turn in the next round)
        paths = (
            _listed(root, cast(tuple, spec), prefix)  # (strict: the names and classes)
            if strict
            else _outermost(p for p in repeated if p not in excluded)
        )
        gm = _leaf_trace(root, examples, paths, binding)
        groups, dropped = _group_sites(root, gm, paths, strict, prefix)
        if not dropped:
            return OutlinePlan(gm, groups)
        excluded |= dropped
    return OutlinePlan(_leaf_trace(root, examples, [], binding))


_ROUNDS = 6  # traces "auto" tries before it inlines everything


def _leaf_trace(
    root: nn.Module, examples: tuple, paths: list[str], binding: Binding = POSITIONAL
) -> fx.GraphModule:
    ids = {id(root.get_submodule(p)) for p in paths}
    leaf = lambda m: id(m) in ids or is_leaf(m)
    tracer = CaptureTracer(root, examples, leaf=leaf, binding=binding)
    return trace_module(tracer, root)


def _group_sites(
    root: nn.Module, gm: fx.GraphModule, paths: list[str], strict: bool, prefix: str
) -> tuple[list[Group], set[str]]:
    wanted = set(paths)
    keyed: dict[tuple, Group] = {}
    dropped: set[str] = set()
    called: set[str] = set()
    for node in gm.graph.nodes:
        if node.op != "call_module" or node.target not in wanted:
            continue
        called.add(node.target)
        module = root.get_submodule(node.target)
        site = _site(root, module, node, prefix)
        if isinstance(site, str):
            if strict:
                raise OutlineError(
                    f"Options(outline=...): {node.target[len(prefix) :]!r} cannot be outlined: "
                    f"{site}"
                )
            dropped.add(node.target)
            continue
        key, captured = site
        if key not in keyed:
            keyed[key] = Group("", {}, module, captured)
        keyed[key].sites[node.name] = node.target
    for path in wanted - called:
        if strict:
            raise OutlineError(
                f"Options(outline=...): {path[len(prefix) :]!r} is never called by forward."
            )
        dropped.add(path)
    groups = list(keyed.values())
    if not strict:  # a structure seen once saves nothing: inline it
        for g in [g for g in groups if len(g.sites) < 2]:
            dropped.update(g.sites.values())
            groups.remove(g)
    for g in groups:
        g.label = _label(g.paths)  # as the inlined ops' module paths: prefix included
    return groups, dropped


def _site(
    root: nn.Module, module: nn.Module, node: fx.Node, prefix: str
) -> tuple[tuple, Captured] | str:
    """The call site's key (structure, input specs, code) and capture, or why it cannot
    outline."""
    if node.kwargs:
        names = ", ".join(node.kwargs)
        return f"it is called with keyword arguments ({names}); pass tensors positionally."
    args = [a.meta.get("example_value") if isinstance(a, fx.Node) else a for a in node.args]
    if not all(isinstance(a, torch.Tensor) for a in args):
        return "an argument is not a tensor (a python value would be baked into the graph)."
    returned = torch.utils._pytree.tree_leaves(node.meta.get("example_value"))
    if not returned or not all(isinstance(r, torch.Tensor) for r in returned):
        return "it returns something other than tensors (a graph returns tensors only)."
    shared = _shared_tensors(root, module)
    if shared:
        shared = shared[len(prefix) :] if shared.startswith(prefix) else shared
        return f"it shares {shared!r} with the rest of the model (tied weights)."
    if is_leaf(module):  # one lowering runs it: the block graph is that one call
        captured = _leaf_capture(module, tuple(args))
        specs = tuple((tuple(a.shape), a.dtype) for a in args)
        return (_structure(module), specs, "leaf", _configuration(module)), captured
    captured = capture(module, tuple(args))
    fatal = [i for i in captured.issues if i.kind not in WARN_KINDS]  # the model's check warns
    if fatal:
        return f"its forward does not trace alone: {fatal[0].what}"
    written = [n.name for n in captured.gm.graph.nodes if _writes_placeholder(n, module)]
    if written:
        return f"its forward writes its input {written[0]!r} in place."
    placeholders = [n for n in captured.gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(args):
        return "it is called with fewer arguments than its forward takes (defaults)."
    # the block graph is lowered from this capture; the model's own check covers its code
    captured.checked = []
    specs = tuple((tuple(a.shape), a.dtype) for a in args)
    return (_structure(module), specs, captured.gm.code, _constants(captured.gm, module)), captured


class _LeafGraph:
    """An fx graph that calls its root module once (``call_module`` with target ``""``): what
    `run_graph` lowers for a torch.nn layer with its own lowering."""

    def __init__(self, graph: fx.Graph) -> None:
        self.graph = graph


def _leaf_capture(module: nn.Module, args: tuple) -> Captured:
    graph = fx.Graph()
    inputs = []
    for i, a in enumerate(args):
        inputs.append(graph.placeholder(f"input{i}"))
        inputs[-1].meta["example_value"] = a
    call = graph.call_module("", tuple(inputs))
    with preserved(module), torch.no_grad():
        call.meta["example_value"] = module(*args)
    call.meta["module_path"] = ""
    graph.output(call)
    return Captured(_LeafGraph(graph), [], checked=[], example_inputs=args)


def _configuration(module: nn.Module) -> tuple:
    """The plain attributes of a layer and its children (``nhead``, ``norm_first``, ``eps``,
    the activation function): what its lowering reads besides the tensors."""
    config = []
    for sub in module.modules():
        for key, value in vars(sub).items():
            if key.startswith("_") or key == "training" or isinstance(value, torch.Tensor):
                continue
            plain = isinstance(value, (bool, int, float, str, type(None), tuple))
            config.append((key, value if plain else id(value)))
    return tuple(config)


def _writes_placeholder(node: fx.Node, module: nn.Module) -> bool:
    if node.op not in ("call_function", "call_method"):
        return False
    target = mutated_input(node, module)
    return target is not None and target.op == "placeholder"


def _shared_tensors(root: nn.Module, module: nn.Module) -> str | None:
    """The first name (in ``root``'s order) of a tensor of ``module`` that a module outside
    it also holds."""
    inside = {id(t) for t in (*module.parameters(), *module.buffers())}
    own = {id(m) for m in module.modules()}
    owners = dict(root.named_modules(remove_duplicate=False))  # each tensor's module, by path
    for name, t in (
        *root.named_parameters(remove_duplicate=False),
        *root.named_buffers(remove_duplicate=False),
    ):
        if id(t) in inside and id(owners[name.rsplit(".", 1)[0] if "." in name else ""]) not in own:
            return name
    return None


def _constants(gm: fx.GraphModule, module: nn.Module) -> tuple:
    """The values of the plain tensors the code reads (they become graph constants)."""
    own = {id(t) for t in (*module.parameters(), *module.buffers())}
    values = []
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        value: Any = gm
        for part in node.target.split("."):
            value = getattr(value, part)
        if isinstance(value, torch.Tensor) and id(value) not in own:
            values.append((node.target, value.detach().cpu().numpy().tobytes()))
    return tuple(values)


def _label(paths: list[str]) -> str:
    """``["blocks.0", "blocks.1"]`` -> ``"blocks.*"``; the paths joined when they differ more."""
    parts = [p.split(".") for p in paths]
    if len({len(p) for p in parts}) == 1:
        diff = [i for i in range(len(parts[0])) if len({p[i] for p in parts}) > 1]
        if len(diff) <= 1:
            return ".".join("*" if i in diff else s for i, s in enumerate(parts[0]))
    return "{" + ",".join(paths) + "}"
