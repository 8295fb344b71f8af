"""In-place torch calls in a traced graph.

An fx graph keeps using a tensor's old node after ``h.add_(1)``; eager torch sees the new
value. The driver rebinds the mutated node to the in-place call's result (`mutated_input`).
That is exact unless the mutated tensor shares memory with another node's tensor (a view of
it, or the tensor it is a view of): `inplace_view_issues` reports those. An in-place update of
a buffer (``self.count.add_(1)``) is also written back to the buffer's variable; one of a
parameter or of a tensor held as a plain attribute is state the program cannot carry between
steps: `inplace_state_issues` reports those.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
from torch import nn

from .errors import Issue

__all__ = ["inplace_state_issues", "inplace_view_issues", "is_view", "mutated_input"]

_VIEW_METHODS = frozenset(
    {
        "view",
        "view_as",
        "reshape",
        "reshape_as",
        "flatten",
        "unflatten",
        "squeeze",
        "unsqueeze",
        "transpose",
        "permute",
        "t",
        "expand",
        "expand_as",
        "narrow",
        "select",
        "unfold",
        "movedim",
        "swapaxes",
        "swapdims",
        "as_strided",
        "split",
        "chunk",
        "unbind",
        "detach",
    }
)
_VIEW_FUNCTIONS = frozenset(
    {
        operator.getitem,
        torch.reshape,
        torch.flatten,
        torch.squeeze,
        torch.unsqueeze,
        torch.transpose,
        torch.permute,
        torch.narrow,
        torch.select,
        torch.movedim,
        torch.split,
        torch.chunk,
        torch.unbind,
        torch.detach,
        torch.t,
    }
)


def mutated_input(node: fx.Node, root: nn.Module) -> fx.Node | None:
    """The node whose tensor ``node`` updates in place (``x.add_``, ``inplace=True``)."""
    if not node.args or not isinstance(node.args[0], fx.Node):
        return None
    if node.op == "call_method":
        name = str(node.target)
        inplace = name.endswith("_") and not name.startswith("_")
    elif node.op == "call_module":
        inplace = bool(getattr(root.get_submodule(node.target), "inplace", False))
    else:
        inplace = node.kwargs.get("inplace") is True
    return node.args[0] if inplace else None


def is_view(node: fx.Node) -> bool:
    """Whether ``node``'s tensor is a view of its first argument's (shares its memory)."""
    if node.op == "call_method":
        return node.target in _VIEW_METHODS
    return node.op == "call_function" and node.target in _VIEW_FUNCTIONS


def _aliases(target: fx.Node, update: fx.Node, order: dict[fx.Node, int]) -> set[fx.Node]:
    """Nodes whose tensors share memory with ``target``'s when ``update`` changes it in
    place: its bases and their views. A view of ``target`` itself taken after the update
    reads the updated value (the driver rebinds ``target``), so it does not count."""
    family = {target}
    base = target
    while is_view(base) and isinstance(base.args[0], fx.Node):
        base = base.args[0]
        family.add(base)
    for n in list(family):
        family.update(
            u for u in n.users if is_view(u) and (n is not target or order[u] < order[update])
        )
    return family - {target}


def inplace_view_issues(gm: fx.GraphModule, root: nn.Module) -> list[Issue]:
    """In-place updates whose effect eager torch would show through another node's tensor
    (a view or base of the updated one, used after the update)."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    issues = []
    for node in gm.graph.nodes:
        target = mutated_input(node, root)
        if target is None:
            continue
        aliases = _aliases(target, node, order)
        later = [a for a in aliases if any(order[u] > order[node] for u in a.users)]
        if later:
            issues.append(
                Issue(
                    "in-place update of a view",
                    f"{node.target} on '{target.name}', which shares "
                    f"memory with '{later[0].name}' (used later)",
                    node.meta.get("source", "<unknown>"),
                    node.meta.get("module_path", ""),
                    node.name,
                    "eager torch changes the tensors sharing its memory too; use the "
                    "out-of-place op (e.g. add instead of add_).",
                )
            )
    return issues


def inplace_state_issues(gm: fx.GraphModule, root: nn.Module) -> list[Issue]:
    """In-place updates of model attributes that are not buffers (parameters, plain tensor
    attributes): eager torch keeps the new value for the next call, a static program can't."""
    buffers = {name for name, _ in root.named_buffers()}
    issues = []
    for node in gm.graph.nodes:
        target = mutated_input(node, root)
        if target is None or target.op != "get_attr" or target.target in buffers:
            continue
        is_param = target.target in dict(root.named_parameters())
        what = "parameter" if is_param else "plain tensor attribute"
        issues.append(
            Issue(
                "hidden state",
                f"{node.target} updates the {what} '{target.target}' in place",
                node.meta.get("source", "<unknown>"),
                node.meta.get("module_path", ""),
                node.name,
                "eager torch keeps the new value for the next call, the simulated program "
                "would not; register it with `self.register_buffer(...)` (or update a copy).",
            )
        )
    return issues
