"""``as_strided`` and its copy and scatter forms: ops that address their input's storage.

Eager's ``x.as_strided(size, stride, offset)`` reads ``x``'s storage, so its result depends on
how ``x`` lies in memory (a transposed view, a slice at an offset), not only on its values.
The simulator's tensor holding ``x`` has eager's values but not eager's storage (a
``.contiguous()`` of a transposed view may be the view itself; a slice may be a copy). Each
kernel here therefore first rebuilds the storage eager had: a buffer in which ``x``'s values
sit at eager's strides and offset (`StorageLayout`, read from the traced graph), then applies
the op to that buffer. Elements of the storage outside ``x`` (the rest of the tensor ``x`` is
a view of) are not in the program: an op that reads them is refused at lowering, naming the
node, never a silent wrong value.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.fx as fx

from popxl_core.ops import Slot, aten_op

from ..lowering import LoweringContext, lowers

__all__ = ["StorageLayout", "StridedRead", "StridedScatter", "record_storage"]

aten = torch.ops.aten
STRIDED = (aten.as_strided, aten.as_strided_copy, aten.as_strided_scatter)
# node meta key: the StorageLayout of the node's value when the traced call ran on real tensors
STORAGE = "storage_layout"


@dataclass(frozen=True)
class StorageLayout:
    """Where a tensor's elements lie in its storage in eager: ``stride`` and ``offset``."""

    shape: tuple
    stride: tuple
    offset: int

    @property
    def extent(self) -> int:
        """Storage elements up to the tensor's last one (0 for an empty tensor)."""
        return _extent(self.shape, self.stride, self.offset)

    @functools.cached_property
    def positions(self) -> torch.Tensor:
        """The storage position of each element, flat in row-major order (made once: the
        kernels read it on every run)."""
        index = torch.arange(max(self.extent, 1))
        return index.as_strided(self.shape, self.stride, self.offset).reshape(-1)

    def storage(self, x: torch.Tensor, extent: int) -> torch.Tensor:
        """A buffer of ``extent`` elements holding ``x`` at this layout (zeros elsewhere)."""
        return _ToStorage.apply(x, self.positions, max(extent, self.extent))


def _extent(size: Sequence[int], stride: Sequence[int], offset: int) -> int:
    if any(n == 0 for n in size):
        return offset
    return offset + 1 + sum((n - 1) * s for n, s in zip(size, stride))


class _ToStorage(torch.autograd.Function):
    """``x`` written into a zero buffer at ``positions``, with the gradient eager's
    ``as_strided`` backward gives ``x``: each storage element's gradient, divided by the number
    of elements of ``x`` that share it (an expanded ``x``), read back at ``positions``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, positions: torch.Tensor, extent: int) -> torch.Tensor:
        ctx.save_for_backward(positions)
        ctx.shape = x.shape
        buf = x.new_zeros(extent)
        # with shared positions every sharer holds the same value: any one of them will do
        buf[positions] = x.reshape(-1)
        return buf

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (positions,) = ctx.saved_tensors
        if positions.unique().numel() != positions.numel():
            ones = torch.ones_like(grad)[positions]
            grad = grad / torch.zeros_like(grad).index_add_(0, positions, ones)
        return grad[positions].reshape(ctx.shape), None, None


@dataclass(frozen=True)
class StridedRead:
    """``as_strided(x, size, stride, offset)`` on eager's storage of ``x``."""

    layout: StorageLayout
    size: tuple
    stride: tuple
    offset: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        buf = self.layout.storage(x, _extent(self.size, self.stride, self.offset))
        return buf.as_strided(self.size, self.stride, self.offset)

    def __str__(self) -> str:
        return "aten.as_strided"


@dataclass(frozen=True)
class StridedScatter:
    """``as_strided_scatter(x, src, size, stride, offset)`` on eager's storage of ``x``: ``x``'s
    values with those ``x.as_strided(size, stride, offset)`` reads replaced by ``src``."""

    layout: StorageLayout
    size: tuple
    stride: tuple
    offset: int

    def __call__(self, x: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        buf = self.layout.storage(x, _extent(self.size, self.stride, self.offset)).clone()
        buf.as_strided(self.size, self.stride, self.offset).copy_(src)
        return buf[self.layout.positions].reshape(self.layout.shape)

    def __str__(self) -> str:
        return "aten.as_strided_scatter"


def record_storage(gm: fx.GraphModule, inputs: Sequence[torch.Tensor]) -> None:
    """Note on each argument of an ``as_strided``-family node of ``gm`` (an ATen graph traced
    from a call on ``inputs``) how its value lies in storage, by running ``gm`` on ``inputs``:
    the fake values ``make_fx`` records keep strides but start every tensor at offset 0."""
    wanted = {a for n in gm.graph.nodes if _packet(n) in STRIDED for a in n.args[:1] if _is_node(a)}
    if not wanted:
        return
    _StorageRecorder(gm, wanted).run(*inputs)


class _StorageRecorder(fx.Interpreter):
    """Runs a graph, noting the storage layout of the values of the ``wanted`` nodes (the
    interpreter drops each value after its last use, so it is noted as it is made)."""

    def __init__(self, gm: fx.GraphModule, wanted: set) -> None:
        super().__init__(gm)
        self.wanted = wanted

    def run_node(self, n: fx.Node) -> Any:
        value = super().run_node(n)
        if n in self.wanted and isinstance(value, torch.Tensor):
            n.meta[STORAGE] = _layout_of(value)
        return value


def _packet(node: fx.Node) -> Any:
    return getattr(node.target, "overloadpacket", None) if node.op == "call_function" else None


def _is_node(a: Any) -> bool:
    return isinstance(a, fx.Node)


def _layout_of(t: torch.Tensor) -> StorageLayout:
    return StorageLayout(tuple(t.shape), tuple(t.stride()), int(t.storage_offset()))


def eager_layout(source: Any, name: str) -> StorageLayout:
    """The layout eager's tensor had for graph argument ``source`` of node ``name``."""
    seen = None
    if isinstance(source, fx.Node):
        if STORAGE in source.meta:
            return source.meta[STORAGE]
        seen = source.meta.get("val", source.meta.get("example_value"))
    if not isinstance(seen, torch.Tensor):
        raise NotImplementedError(
            f"as_strided (fx node '{name}'): the traced graph does not say how its input lies "
            "in memory, which as_strided's result depends on; call .contiguous() on the input "
            "and index it with view/reshape/slicing instead of as_strided"
        )
    return _layout_of(seen)


def check_reads_inside(layout: StorageLayout, size, stride, offset: int, name: str) -> None:
    """Refuse an access of storage elements that do not belong to the input tensor (the rest
    of the tensor it is a view of): the program does not hold them."""
    end = max(layout.extent, _extent(size, stride, offset))
    held = torch.zeros(max(end, 1), dtype=torch.bool)
    held[layout.positions] = layout.extent > 0
    read = torch.arange(max(end, 1)).as_strided(tuple(size), tuple(stride), offset)
    outside = read[~held[read]]
    if outside.numel():
        raise NotImplementedError(
            f"as_strided (fx node '{name}') reads storage element {int(outside.min())}, which "
            f"is not part of its input (shape {list(layout.shape)}, stride "
            f"{list(layout.stride)}, storage offset {layout.offset}) but of the tensor it is a "
            "view of; the compiled program holds only the input's values. Apply as_strided "
            "to that whole tensor instead."
        )


def _geometry(layout: StorageLayout, size, stride, storage_offset) -> tuple:
    """(layout, size, stride, offset) of an as_strided call; no offset: the input's own."""
    offset = layout.offset if storage_offset is None else int(storage_offset)
    return layout, tuple(int(n) for n in size), tuple(int(s) for s in stride), offset


@lowers(aten.as_strided, aten.as_strided_copy)
def lower_as_strided(
    ctx: LoweringContext, x: Any, size: Any, stride: Any, storage_offset: Any = None
) -> Any:
    """``as_strided`` (and its copying form) read from eager's storage of ``x``."""
    layout = eager_layout(ctx.node.args[0], ctx.node.name)
    read = StridedRead(*_geometry(layout, size, stride, storage_offset))
    check_reads_inside(layout, read.size, read.stride, read.offset, ctx.node.name)
    return aten_op(read, [x], (Slot(0),))[0]


@lowers(aten.as_strided_scatter)
def lower_as_strided_scatter(
    ctx: LoweringContext, x: Any, src: Any, size: Any, stride: Any, storage_offset: Any = None
) -> Any:
    """``as_strided_scatter``: ``src`` written into eager's storage of ``x``. Eager writes
    into a clone of that storage (elements outside ``x`` may be written; none is read back),
    or of ``x`` made contiguous where ``x`` has elements sharing memory (an expanded view)."""
    layout = eager_layout(ctx.node.args[0], ctx.node.name)
    if layout.positions.unique().numel() != layout.positions.numel():
        layout = StorageLayout(layout.shape, _contiguous(layout.shape), 0)
    scatter = StridedScatter(*_geometry(layout, size, stride, storage_offset))
    return aten_op(scatter, [x, src], (Slot(0), Slot(1)))[0]


def _contiguous(shape: tuple) -> tuple:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))
