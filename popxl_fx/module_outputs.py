"""What `popxl_fx.Module.build` returns: the forward's outputs in its structure, flat with
``flatten_outputs`` (a None output is no graph output; `unflatten` puts it back), then the
final values of the inputs forward updates in place, which `inference_model` writes back
into the caller's tensors as eager does (`writes_inputs`, `written_inputs`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

import popxl_core as popxl

from .capture import Captured
from .view_writes import warn_unwritten

__all__ = ["Outputs"]


class Outputs:
    """Mixin of `popxl_fx.Module`: its outputs' structure."""

    flatten_outputs: bool
    out_spec: pytree.TreeSpec | None
    torch_module: torch.nn.Module
    # with flatten_outputs: return the final values of the inputs forward updates in place
    # after the outputs (`written_inputs` says which), as `inference_model` writes them back
    writes_inputs = False
    written_inputs: tuple[int, ...] = ()
    _nones: tuple[int, ...] = ()
    _rebuild: tuple = (None, None)  # (out_spec, `_rebuilder(out_spec)`)

    def _outputs(
        self, gm: fx.GraphModule, captured: Captured, out: Any, written: dict[int, popxl.Tensor]
    ) -> Any:
        """What `build` returns: the forward's outputs (flat with ``flatten_outputs``, then
        the inputs it updated in place, for `writes_inputs`)."""
        leaves, spec = _as_returned(out, gm, captured.out_spec)
        if not self.flatten_outputs:
            return pytree.tree_unflatten(leaves, spec)
        self.out_spec = spec
        # a None output (forward returns None, or None in a tuple) is no graph output:
        # `unflatten` puts it back
        self._nones = tuple(i for i, v in enumerate(leaves) if v is None)
        self.written_inputs = tuple(sorted(written)) if self.writes_inputs else ()
        if written and not self.writes_inputs:
            warn_unwritten(self.torch_module, sorted(written))
        kept = tuple(v for v in leaves if v is not None)
        return kept + tuple(written[i] for i in self.written_inputs)

    def unflatten(self, leaves: Any) -> Any:
        """The forward's output structure around ``leaves`` (after ``flatten_outputs``; the
        written inputs that follow the outputs are left out)."""
        if self.out_spec is None:
            raise RuntimeError("unflatten() needs a build with flatten_outputs=True first.")
        full, nones = list(leaves)[: self.n_outputs], self._nones
        if nones:
            given = iter(full)
            full = [None if i in nones else next(given) for i in range(self.out_spec.num_leaves)]
        spec, rebuild = self._rebuild
        if spec is not self.out_spec:  # planned once per structure (a PopTorch call's outputs)
            spec, rebuild = self._rebuild = (self.out_spec, _rebuilder(self.out_spec))
        return rebuild(iter(full))

    @property
    def n_outputs(self) -> int:
        """How many graph outputs are the forward's own (after ``flatten_outputs``)."""
        assert self.out_spec is not None, "built with flatten_outputs=True"
        return self.out_spec.num_leaves - len(self._nones)


def _as_returned(out: Any, gm: fx.GraphModule, returned: Any) -> tuple[list, Any]:
    """The leaves of the lowered outputs ``out`` and the structure forward returned
    (dataclasses, ModelOutputs: ``returned``, captured per graph output), each graph output
    keeping its own structure (a call returning a tuple, as ``torch.meshgrid``, is one
    output of the graph)."""
    per_node = pytree.tree_structure(next(reversed(gm.graph.nodes)).args[0])
    if returned is None or returned.num_leaves != per_node.num_leaves:
        return pytree.tree_flatten(out)
    return pytree.tree_flatten(pytree.tree_unflatten(per_node.flatten_up_to(out), returned))


def _rebuilder(spec: pytree.TreeSpec) -> Callable[[Iterator[Any]], Any]:
    """What ``pytree.tree_unflatten(leaves, spec)`` does, as a function of an iterator over
    the leaves: each node's unflatten function (torch's own, from its table) around its
    children's, without tree_unflatten's checks and list slicing at every node per call."""
    if spec.is_leaf():
        return next
    parts = [_rebuilder(spec.child(i)) for i in range(spec.num_children)]
    unflatten, context = pytree.SUPPORTED_NODES[spec.type].unflatten_fn, spec.context
    return lambda leaves: unflatten([part(leaves) for part in parts], context)
