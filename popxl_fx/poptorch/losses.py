"""The training loss, found as PopTorch finds it.

PopTorch turns every torch loss (``F.nll_loss``, ``nn.L1Loss``, ...) and every
``poptorch.identity_loss`` into a loss op of its graph. A loss that feeds another loss is
folded into it; exactly one must remain ("Couldn't find a loss in graph!" when there is
none, "Multiple independent losses ..." when there are several).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
from torch import nn

from .errors import Error

__all__ = ["final_loss"]

_MULTIPLE = (
    "Multiple independent losses found in graph. Graph must have one final loss. "
    "Wrap final graph loss in poptorch.identity_loss."
)


def _is_torch_loss(node: fx.Node, root: nn.Module) -> bool:
    if node.op == "call_module":
        return isinstance(root.get_submodule(node.target), nn.modules.loss._Loss)
    if node.op != "call_function":
        return False
    name = getattr(node.target, "__name__", "")
    module = getattr(node.target, "__module__", "") or ""
    functional = module.startswith("torch.nn.functional") or module == "torch._C._nn"
    return functional and (name.endswith("_loss") or name in _LOSS_FUNCTIONS)


# torch.nn.functional's losses whose names do not end in "_loss"
_LOSS_FUNCTIONS = {
    "cross_entropy",
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "kl_div",
}


def _feeds_another(node: fx.Node, losses: set) -> bool:
    """Whether ``node`` reaches another loss through its users."""
    seen, todo = set(), list(node.users)
    while todo:
        user = todo.pop()
        if user in losses:
            return True
        if user not in seen:
            seen.add(user)
            todo.extend(user.users)
    return False


def final_loss(marked: list, out: Any) -> Any:
    """The one independent loss of the traced forward (a Proxy): PopTorch's rule over the
    ``identity_loss`` results ``marked`` and the torch losses of the graph."""
    proxies = [x for x in (*marked, *_leaves(out)) if isinstance(x, fx.Proxy)]
    if not proxies:  # not traced: nothing to look at
        return marked[-1] if marked else None
    tracer = proxies[0].tracer
    nodes = {p.node: p for p in marked if isinstance(p, fx.Proxy)}
    for node in tracer.graph.nodes:
        if node not in nodes and _is_torch_loss(node, tracer.root):
            nodes[node] = fx.Proxy(node, tracer)
    if not nodes:
        raise Error("Couldn't find a loss in graph!")
    final = [n for n in nodes if not _feeds_another(n, set(nodes) - {n})]
    if len(final) != 1:
        raise Error(_MULTIPLE)
    return nodes[final[0]]


def _leaves(out: Any) -> list:
    return torch.utils._pytree.tree_leaves(out)
