"""Which phases a traced model runs in, and the model's fx graph cut into them.

`phase_paths` turns ``Options(phased_execution=...)`` into module paths: ``"children"`` the
model's top-level children (a ModuleList's or ModuleDict's items in its place), ``"blocks"``
the repeated blocks ``outline="auto"`` finds, ``"marked"`` the modules marked with `phase`, or
the modules a list names. `split_pieces` traces the model with those modules as leaves and
cuts the graph into `Piece`s in execution order: one per phase module call, and one for the
code between two phases (glue: embeddings, the loss, ...). Each piece is an
``fx.GraphModule`` of its own over the same torch tensors (qualified names kept:
``"blocks.3.attn.weight"``) that `popxl_fx.Module` lowers like any model; its inputs and
outputs are the values that cross the cut, in node order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.fx as fx
from torch import nn

from popxl_core.sim.report import fmt_bytes

from .calls import POSITIONAL, Binding
from .capture import CaptureTracer, is_leaf, trace_module
from .outline import plan_outline

__all__ = [
    "Piece",
    "PhaseError",
    "check_phase_sizes",
    "marked",
    "phase",
    "phase_paths",
    "phase_plan",
    "split_pieces",
]

_MARK = "_popxl_fx_phase"  # the attribute `phase` sets (copied with the module by deepcopy)


def phase(module: nn.Module) -> nn.Module:
    """Mark ``module`` as a phase of ``Options(phased_execution="marked")`` and return it
    (so it can wrap a layer where it is made: ``nn.Sequential(phase(nn.Linear(8, 8)), ...)``).

    The mark only names the phase: without ``phased_execution="marked"`` (or
    ``memory="auto"``, which tries the marked phases first) the model trains as before.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"popxl_fx.phase expects an nn.Module (the layer or block to run as one phase), "
            f"got {type(module).__name__}."
        )
    object.__setattr__(module, _MARK, True)
    return module


def marked(model: nn.Module) -> list[str]:
    """The paths of ``model``'s submodules marked with `phase`, in registration order."""
    return [n for n, m in model.named_modules() if n and getattr(m, _MARK, False)]


class PhaseError(ValueError):
    """A ``phased_execution=`` value that does not fit the model."""


@dataclass
class Piece:
    """A cut of the traced graph: a phase module's call, or the glue between phases.

    Attributes:
        label: the phase's module path (user's names), or "glue before <phase>" / "glue
            after <phase>".
        phase: True for a phase module's call.
        nodes: the traced graph's nodes it runs, in order.
        inputs: nodes outside it whose values it reads (in first-use order).
        outputs: its nodes read outside it (later pieces or the model's output).
        gm: the piece as a graph module (inputs as placeholders, outputs as a tuple).
    """

    label: str
    phase: bool
    nodes: list[fx.Node] = field(default_factory=list)
    inputs: list[fx.Node] = field(default_factory=list)
    outputs: list[fx.Node] = field(default_factory=list)
    gm: fx.GraphModule | None = None

    def examples(self) -> tuple:
        """The inputs' values on the example inputs (what the piece is captured with)."""
        return tuple(n.meta["example_value"] for n in self.inputs)


def _model(root: nn.Module, prefix: str) -> nn.Module:
    return root.get_submodule(prefix[:-1]) if prefix else root


def phase_paths(root: nn.Module, spec: str | tuple, examples: tuple, prefix: str = "") -> list:
    """The module paths (in ``root``) of the phases ``spec`` asks for."""
    return phase_plan(root, spec, examples, prefix)[0]


def phase_plan(root: nn.Module, spec: str | tuple, examples: tuple, prefix: str = "") -> tuple:
    """`phase_paths`, and the leaf trace of ``root`` on ``examples`` (positional binding)
    whose leaves are exactly those paths when finding them made one, else None: ``"blocks"``
    keeps `plan_outline`'s last trace, so that `split_pieces` need not trace it again."""
    model = _model(root, prefix)
    traced = None
    if spec == "children":
        paths = _callable_children(model)
        if not paths:
            raise PhaseError(
                f"Options(phased_execution='children'): {type(model).__name__} has no child "
                "modules; phases need modules holding the parameters."
            )
    elif spec == "blocks":
        paths, traced = _blocks(root, examples, prefix)
    elif spec == "marked":
        paths = _marked(model)
    else:
        paths = _listed(model, spec)
    return [prefix + p for p in paths], traced


def _blocks(root: nn.Module, examples: tuple, prefix: str) -> tuple[list[str], fx.GraphModule]:
    """The repeated blocks ``outline="auto"`` outlines, and `plan_outline`'s trace. Its
    leaves are exactly these blocks: a plan returns its trace only when no leaf of it was
    dropped (every one called, each in a group of two or more sites: `outline._group_sites`),
    so its groups' paths are its leaves."""
    plan = plan_outline(root, "auto", examples, prefix)
    paths = [p[len(prefix) :] for g in plan.groups for p in g.paths]
    if not paths:
        raise PhaseError(
            "Options(phased_execution='blocks'): the model has no repeated blocks that "
            "outline='auto' would outline; use phased_execution='children' or a list of "
            "module names."
        )
    return paths, plan.gm


def _marked(model: nn.Module) -> list[str]:
    paths = marked(model)
    if not paths:
        raise PhaseError(
            "Options(phased_execution='marked'): no submodule of "
            f"{type(model).__name__} is marked; mark each phase with "
            "popxl_fx.phase(module) (e.g. model.blocks[0] = popxl_fx.phase(model.blocks[0])), "
            "or use 'children' / 'blocks' / a list of module names."
        )
    return _listed(model, paths, "popxl_fx.phase")


def _callable_children(module: nn.Module, prefix: str = "") -> list[str]:
    """The top-level children, a ModuleList's or ModuleDict's items in its place: a container
    without forward is never called as a whole, its items are (``blocks.0``, ``blocks.1``)."""
    paths = []
    for name, child in module.named_children():
        if isinstance(child, (nn.ModuleList, nn.ModuleDict)):
            paths += _callable_children(child, f"{prefix}{name}.")
        else:
            paths.append(prefix + name)
    return paths


def _listed(model: nn.Module, spec: Sequence[str], how: str = "") -> list[str]:
    modules = dict(model.named_modules())
    for name in spec:
        if name not in modules or not name:
            children = ", ".join(n for n, _ in model.named_children()) or "none"
            raise PhaseError(
                f"Options(phased_execution=...): {name!r} names no submodule of "
                f"{type(model).__name__}; give names from model.named_modules() (its children: "
                f"{children}), or 'children' / 'blocks'."
            )
    for a in spec:
        for b in spec:
            if b.startswith(a + "."):
                fix = (
                    "unmark the outer or the inner ones"
                    if how
                    else "list the outer or the inner modules"
                )
                raise PhaseError(
                    f"Options(phased_execution=...): {b!r} is inside {a!r}"
                    f"{' (both marked with ' + how + ')' if how else ''}; a phase cannot "
                    f"hold another: {fix}."
                )
    return list(dict.fromkeys(spec))


def split_pieces(
    root: nn.Module,
    examples: tuple,
    paths: list[str],
    prefix: str = "",
    binding: Binding = POSITIONAL,
    traced: fx.GraphModule | None = None,
) -> tuple[fx.GraphModule, list[Piece]]:
    """The leaf trace of ``root`` with ``paths`` as leaves, and its pieces in order.
    ``traced``: that trace, when one was made already (`phase_plan`'s, with ``binding``)."""
    gm = _leaf_trace(root, examples, paths, binding) if traced is None else traced
    pieces = _cut(gm, set(paths), prefix)
    called = {p.nodes[0].target for p in pieces if p.phase}
    for path in paths:
        if path not in called:
            raise PhaseError(
                f"Options(phased_execution=...): {path[len(prefix) :]!r} is never called by "
                "forward as a whole (a ModuleList or ModuleDict is not called: name its items)."
            )
    _connect(pieces)
    training = _model(root, prefix).training
    for p in pieces:
        p.gm = _piece_module(gm, p, training)
    return gm, pieces


def _leaf_trace(root: nn.Module, examples: tuple, paths: list[str], binding: Binding):
    ids = {id(root.get_submodule(p)) for p in paths}
    leaf = lambda m: id(m) in ids or is_leaf(m)
    return trace_module(CaptureTracer(root, examples, leaf=leaf, binding=binding), root)


def _cut(gm: fx.GraphModule, wanted: set[str], prefix: str) -> list[Piece]:
    pieces: list[Piece] = []
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue  # get_attr nodes are copied into every piece that reads them
        if node.op == "call_module" and node.target in wanted:
            if any(p.phase and p.nodes[0].target == node.target for p in pieces):
                raise PhaseError(
                    f"Options(phased_execution=...): {node.target[len(prefix) :]!r} is called "
                    "twice by forward; a phase's weights are loaded once per pass: make it "
                    "part of a larger phase, or leave it out of the list."
                )
            pieces.append(Piece(node.target[len(prefix) :], True, [node]))
            continue
        if not pieces or pieces[-1].phase:
            pieces.append(Piece("", False))
        pieces[-1].nodes.append(node)
    for i, p in enumerate(pieces):
        if not p.phase:
            after = next((q.label for q in pieces[i + 1 :] if q.phase), None)
            p.label = f"glue before {after}" if after else f"glue after {pieces[i - 1].label}"
    return pieces


def _connect(pieces: list[Piece]) -> None:
    for p in pieces:
        inside = set(p.nodes)
        reads = [a for n in p.nodes for a in n.all_input_nodes]
        p.inputs = list(dict.fromkeys(a for a in reads if a not in inside and a.op != "get_attr"))
        p.outputs = [n for n in p.nodes if any(u not in inside for u in n.users)]
        for n in (*p.inputs, *p.outputs):
            if not isinstance(n.meta.get("example_value"), torch.Tensor):
                raise PhaseError(
                    f"Options(phased_execution=...): the value {n.name!r} "
                    f"({type(n.meta.get('example_value')).__name__}) crosses into or out of "
                    f"{p.label!r}; only tensors can pass between phases: compute python "
                    "values inside the phase that uses them, or choose other phases."
                )


def _piece_module(gm: fx.GraphModule, piece: Piece, training: bool) -> fx.GraphModule:
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for i, n in enumerate(piece.inputs):
        env[n] = graph.placeholder(f"input{i}_{n.name}")
    for node in piece.nodes:
        for a in node.all_input_nodes:
            if a.op == "get_attr" and a not in env:
                env[a] = graph.node_copy(a)
        env[node] = graph.node_copy(node, lambda a: env[a])
    graph.output(tuple(env[n] for n in piece.outputs))
    # the root's tensors and modules are shared by qualified name, not copied
    module = fx.GraphModule(gm, graph, class_name=piece.label.replace(" ", "_") or "Piece")
    module.training = training  # the user model's mode, for ops traced in its forward
    return module


def check_phase_sizes(
    root: nn.Module, pieces: list[Piece], prefix: str, slots: int, shards: int, capacity: int
) -> None:
    """Refuse a phase whose trainable parameters and optimizer state alone (``slots`` state
    tensors per parameter, each replica holding ``1/shards`` of them) exceed ``capacity``:
    it cannot fit however the rest is planned."""
    for p in pieces:
        if not p.phase:
            continue
        module = root.get_submodule(prefix + p.label)
        weights = sum(
            -(-t.numel() // shards) * t.element_size()
            for t in module.parameters()
            if t.requires_grad
        )
        if weights * (1 + slots) <= capacity:
            continue
        inner = [f"{p.label}.{n}" for n, _ in module.named_children()][:4]
        split = f"phased_execution={inner!r} (its parts)" if inner else "a smaller layer"
        raise PhaseError(
            f"Options(phased_execution=...): phase {p.label!r} holds {fmt_bytes(weights)} of "
            f"trainable parameters and {fmt_bytes(weights * slots)} of optimizer state per "
            f"replica: {fmt_bytes(weights * (1 + slots))} loaded at its update, more than one IPU"
            f" ({fmt_bytes(capacity)}) before any activation. Split it finer "
            f"({split}), or shard it over replicas: replication_factor=2 or more with "
            "replicated_tensor_sharding=True."
        )
