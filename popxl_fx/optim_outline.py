"""The optimizer update of outlined blocks: one update graph per block shape, called per block.

With ``Options(outline=...)`` the forward and backward of N identical blocks are one graph
each, called N times; left inline, the optimizer update would still be N copies of the same
ops (most of a transformer's code: per parameter, Adam's ten ops). `OutlinedUpdates` builds
a block's update once, in a graph whose inputs are the block's weights and state (by
reference: PopXL's ``graph_input(..., by_ref=True)``, so the call updates the caller's
variables in place), its gradients and the hyper-parameter scalars, and calls it once per
block. The graph holds the same ops, in the same order, that `OptimizerProgram` writes
inline: the numbers are the same bit for bit. Blocks share a graph when their parameters
(names relative to the block, shapes, dtypes) and param group are the same.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import popxl_core as popxl
from popxl_core import ops
from popxl_core.context import module_origin

__all__ = ["OutlinedUpdates", "block_chunks"]


def block_chunks(names: Sequence[str], blocks: Sequence[Sequence[str]]) -> list[tuple]:
    """``names`` split into ``(block path, its names)`` in order, a name outside every block
    as ``("", [name])``; a block with a single parameter stays inline (nothing to share)."""
    paths = [p for group in blocks for p in group]
    chunks: list[tuple] = []
    where: dict[str, list[str]] = {}
    for n in names:
        block = next((p for p in paths if n.startswith(p + ".")), "")
        if not block:
            chunks.append(("", [n]))
        elif block in where:
            where[block].append(n)
        else:
            where[block] = [n]
            chunks.append((block, where[block]))
    return [c for b, names_ in chunks for c in _inline_single(b, names_)]


def _inline_single(block: str, names: list[str]) -> list[tuple]:
    return [(block, names)] if block and len(names) > 1 else [("", [n]) for n in names]


@dataclass(frozen=True)
class _Slot:
    """One input of an update graph: where the call site finds its value."""

    kind: str  # "param" (by reference), "grad", "hyper", "state" (by reference)
    rel: str  # the parameter's name in the block ("attn.qkv.weight"); hyper: its name
    key: str = ""  # state: its key ("exp_avg"); hyper: the dtype's name
    dtype: Any = None  # state: the dtype asked for (None: the weight's)


@dataclass
class _UpdateGraph:
    graph: popxl.Graph
    slots: list[_Slot]


class OutlinedUpdates:
    """The update graphs of one `OptimizerProgram` (per Ir and block shape) and their calls.

    Args:
        program: the `optim.OptimizerProgram` whose updates (`_update`) and state variables
            (`_state_var`) the graphs and calls use.
    """

    def __init__(self, program: Any) -> None:
        self.program = program
        self.graphs: dict[tuple, _UpdateGraph] = {}

    def call(
        self,
        block: str,
        names: list[str],
        targets: Mapping,
        grads: Mapping,
        hyper: Callable,
        group: tuple,
    ) -> None:
        """Update ``block``'s parameters ``names`` with one call of its shape's update graph.

        Args:
            targets: the tensors each update writes (weights, or RTS shards).
            hyper: parameter name -> its hyper-parameter scalars (by name).
            group: ``(param group index, param group)``.
        """
        rel = [n[len(block) + 1 :] for n in names]
        ir = popxl.gcg().ir
        key = (group[0], tuple(_spec(r, targets[n], grads[n]) for r, n in zip(rel, names)))
        hyper_of = {n: hyper(n) for n in names}  # loaded here, in the caller's graph
        tables = {_dtype_of(h): h for h in hyper_of.values()}
        made = self.graphs.get(key)
        if made is None or made.graph.ir is not ir:  # a program is built once per Ir
            made = self.graphs[key] = self._build(block, names, targets, grads, hyper_of, group[1])
        args = [self._argument(s, block, targets, grads, tables) for s in made.slots]
        with module_origin(f"optimizer.{block}"):
            ops.call(made.graph, *args)

    def _argument(self, slot: _Slot, block: str, targets, grads, tables) -> popxl.Tensor:
        if slot.kind == "hyper":
            return tables[slot.key][slot.rel]
        name = f"{block}.{slot.rel}"
        if slot.kind == "param":
            return targets[name]
        if slot.kind == "grad":
            return grads[name]
        return self.program._state_var(name, slot.key, targets[name], slot.dtype)

    def _build(self, block, names, targets, grads, hyper_of, pg) -> _UpdateGraph:
        ir = popxl.gcg().ir
        graph = ir.create_empty_graph(f"optimizer_update_{block.rsplit('.', 1)[0]}")
        slots: list[_Slot] = []
        with graph, popxl.in_sequence(), module_origin(f"optimizer.{block}"):
            inputs = {n: self._weight_inputs(n, block, targets, grads, slots) for n in names}
            hyper_in: dict[tuple, popxl.Tensor] = {}  # (dtype, name) -> the graph's input
            for n in names:
                weight, grad = inputs[n]
                hp = {h: self._hyper_input(h, t, hyper_in, slots) for h, t in hyper_of[n].items()}
                self.program._update(self._state_input(block, slots))(n, weight, grad, hp, pg)
        return _UpdateGraph(graph, slots)

    @staticmethod
    def _weight_inputs(n, block, targets, grads, slots) -> tuple:
        rel = n[len(block) + 1 :]
        t, g = targets[n], grads[n]
        weight = popxl.graph_input(t.shape, t.dtype, f"{rel}.weight", by_ref=True)
        slots.append(_Slot("param", rel))
        grad = popxl.graph_input(g.shape, g.dtype, f"{rel}.grad")
        slots.append(_Slot("grad", rel))
        return weight, grad

    @staticmethod
    def _hyper_input(h: str, t: popxl.Tensor, made: dict, slots: list) -> popxl.Tensor:
        """The graph's input for hyper-parameter ``h`` (one per name and dtype)."""
        key = (t.dtype.name, h)
        if key not in made:
            slots.append(_Slot("hyper", h, t.dtype.name))
            made[key] = popxl.graph_input((), t.dtype, f"{h}.{t.dtype.name}")
        return made[key]

    @staticmethod
    def _state_input(block: str, slots: list) -> Callable:
        """A `_state_var` stand-in: the state tensor as a by-reference graph input."""

        def state(name: str, key: str, like: popxl.Tensor, dtype=None) -> popxl.Tensor:
            shape, dt = ((), popxl.float32) if key == "step" else (like.shape, dtype or like.dtype)
            rel = name[len(block) + 1 :]
            slots.append(_Slot("state", rel, key, dtype))
            return popxl.graph_input(shape, dt, f"{rel}.{key}", by_ref=True)

        return state


def _spec(rel: str, target: popxl.Tensor, grad: popxl.Tensor) -> tuple:
    return (rel, tuple(target.shape), target.dtype, tuple(grad.shape), grad.dtype)


def _dtype_of(hyper: Mapping[str, popxl.Tensor]) -> str:
    return next(iter(hyper.values())).dtype.name
