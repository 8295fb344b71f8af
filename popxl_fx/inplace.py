"""In-place torch calls in a traced graph.

An fx graph keeps using a tensor's old node after ``h.add_(1)``; eager torch sees the new
value. The driver rebinds the mutated node to the in-place call's result (`mutated_input`:
``x.add_(y)``, ``x += y``, ``x[i] = v``, ``inplace=True``). Where the mutated tensor shares
memory with others, `popxl_fx.view_writes` writes the update into the tensors it views
(`written_chain`) and takes their other views again; an update it cannot write back (through
``split`` or ``expand``) is reported by `inplace_view_issues`. An in-place update of a buffer
(``self.count.add_(1)``) is also written back to the buffer's variable, one of a model input
to the caller's tensor (`inference_model`); one of a parameter or of a tensor held as a plain
attribute is state the program cannot carry between steps: `inplace_state_issues` reports
those.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from .errors import Issue

__all__ = [
    "base_chain",
    "inplace_state_issues",
    "inplace_view_issues",
    "is_made_constant",
    "is_view",
    "mutated_input",
    "setitem",
    "writes_through",
    "written_chain",
]

# ``x += y`` on a traced tensor (`capture_proxy`), like ``x.add_(y)``
_INPLACE_OPERATORS = frozenset(
    {
        operator.iadd,
        operator.isub,
        operator.imul,
        operator.itruediv,
        operator.ifloordiv,
        operator.imod,
        operator.ipow,
        operator.iand,
        operator.ior,
        operator.ixor,
        operator.ilshift,
        operator.irshift,
    }
)

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


def setitem(x: Any, index: Any, value: Any) -> Any:
    """``x[index] = value`` as a new tensor: what the capture records for item assignment
    (an in-place update of ``x``, see `mutated_input`)."""
    out = x.clone()
    out[index] = value
    return out


def mutated_input(node: fx.Node, root: nn.Module | None) -> fx.Node | None:
    """The node whose tensor ``node`` updates in place (``x.add_``, ``x += y``,
    ``x[i] = v``, ``inplace=True``)."""
    if not node.args or not isinstance(node.args[0], fx.Node):
        return None
    if node.op == "call_function" and (node.target in _INPLACE_OPERATORS or node.target is setitem):
        return node.args[0]
    if node.op == "call_method":
        name = str(node.target)
        inplace = name.endswith("_") and not name.startswith("_")
    elif node.op == "call_module":
        assert root is not None  # a call_module node comes with its root module
        inplace = bool(getattr(root.get_submodule(node.target), "inplace", False))
    else:
        inplace = node.kwargs.get("inplace") is True
        inplace = inplace or _inplace_function(node.target) or _augmented_tensor(node)
    return node.args[0] if inplace else None


def _advanced(index: Any) -> bool:
    """Whether a ``getitem`` index holds tensors or lists (torch copies then)."""
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, (fx.Node, list, torch.Tensor)) for i in items)


def _inplace_function(target: object) -> bool:
    """torch's in-place function spellings (``torch.clamp_min_``, ``F.relu_``): named with a
    trailing underscore, as the methods are."""
    name = getattr(target, "__name__", "")
    if not name.endswith("_") or name.startswith("_"):
        return False
    return any(getattr(space, name, None) is target for space in (torch, nn.functional))


# ``x += y`` on a tensor is its in-place op (``Tensor.__iadd__`` is ``add_``); on a number, not
_AUGMENTED = frozenset({operator.iadd, operator.isub, operator.imul, operator.itruediv})


def _augmented_tensor(node: fx.Node) -> bool:
    example = node.args[0].meta.get("example_value")
    return node.target in _AUGMENTED and isinstance(example, torch.Tensor)


def is_view(node: fx.Node) -> bool:
    """Whether ``node``'s tensor is a view of its first argument's (shares its memory)."""
    if node.op == "call_method":
        return node.target in _VIEW_METHODS
    if node.op != "call_function" or node.target not in _VIEW_FUNCTIONS:
        return False
    if node.target is operator.getitem and len(node.args) == 2:
        base = node.args[0]
        on_tensor = isinstance(base, fx.Node) and isinstance(
            base.meta.get("example_value"), torch.Tensor
        )
        return not (on_tensor and _advanced(node.args[1]))
    return True


def updates_in_place(node: fx.Node) -> bool:
    """Whether ``node`` is a function or method call that returns its first argument's
    tensor, updated in place (``x.add_(1)``, ``x += 1``): the same tensor as that one."""
    return node.op in ("call_function", "call_method") and mutated_input(node, None) is not None


def base_chain(target: fx.Node) -> list[fx.Node]:
    """``target`` and the tensors it is a view of (or the same tensor as: the result of an
    in-place update of one), innermost first."""
    chain = [target]
    while (is_view(chain[-1]) or updates_in_place(chain[-1])) and isinstance(
        chain[-1].args[0], fx.Node
    ):
        chain.append(chain[-1].args[0])
    return chain


# views whose update `popxl_fx.view_writes` writes back into their base: the views but these
# (not inverted there), in both spellings
_NOT_WRITTEN_BACK = frozenset(
    {"expand", "expand_as", "unfold", "movedim", "as_strided", "split", "chunk", "unbind"}
)
_WRITABLE = (_VIEW_METHODS - _NOT_WRITTEN_BACK) | (
    _VIEW_FUNCTIONS - {torch.movedim, torch.split, torch.chunk, torch.unbind}
)


def writes_through(view: fx.Node) -> bool:
    """Whether an update of the view ``view`` is written into its base's tensor too."""
    return updates_in_place(view) or (is_view(view) and view.target in _WRITABLE)


def written_chain(target: fx.Node) -> list[fx.Node]:
    """The tensors an in-place update of ``target`` changes: ``target`` and the bases it
    is a view of, up to the first view that `view_writes` cannot write back through."""
    chain = base_chain(target)
    cut = next((i for i, n in enumerate(chain[:-1]) if not writes_through(n)), len(chain) - 1)
    return chain[: cut + 1]


def _aliases(target: fx.Node, update: fx.Node, order: dict[fx.Node, int]) -> set[fx.Node]:
    """Nodes whose tensors eager changes with ``target``'s but the program would not: the
    bases the update cannot be written back into (past a view such as ``expand``), and
    their views. (The driver rebinds the updated tensor, its bases up to there and every
    view of them: `popxl_fx.view_writes`.)"""
    chain = base_chain(target)
    stale = set(chain[len(written_chain(target)) :])
    for n in list(stale):
        stale.update(u for u in n.users if (is_view(u) or updates_in_place(u)) and u not in chain)
    return stale


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


def is_made_constant(node: fx.Node) -> bool:
    """Whether ``node`` reads a tensor that forward made from constants (``torch.zeros``),
    which the capture folds into a ``_tensor_constant`` attribute: eager makes it anew on
    every call, so an in-place update of it is no state."""
    return node.op == "get_attr" and str(node.target).startswith("_tensor_constant")


def inplace_state_issues(gm: fx.GraphModule, root: nn.Module) -> list[Issue]:
    """In-place updates of model attributes that are not buffers (parameters, plain tensor
    attributes): eager torch keeps the new value for the next call, a static program can't."""
    buffers = {name for name, _ in root.named_buffers()}
    issues = []
    for node in gm.graph.nodes:
        target = mutated_input(node, root)
        target = written_chain(target)[-1] if target is not None else None
        if target is None or target.op != "get_attr" or target.target in buffers:
            continue
        if is_made_constant(target):
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
