"""The op table. Each op is declared once, as an `OpDef`: its PopXL type name, its shape and
dtype rule, its torch kernel, its gradient rule (written with our own ops) and its cost.

Autodiff, the planner, the printer, the simulator and the op tests only look rows up here.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..context import gcg, get_current_context
from ..graph import Graph, Op
from ..sim import speed
from ..tensor import Tensor, TensorSpec
from ._positional import position_invariant, runs_in_whole_blocks

__all__ = [
    "OpDef",
    "Cost",
    "Sample",
    "register",
    "get_opdef",
    "all_opdefs",
    "create_op",
    "check_in_graph",
    "check_tensor_ipu_and_tile_set",
    "copy_cost",
    "elementwise_cost",
    "no_cost",
    "no_grad",
]


@dataclass(frozen=True)
class Cost:
    """Work of one op execution: floating point operations and bytes read + written."""

    flops: int = 0
    bytes: int = 0


@dataclass
class Sample:
    """One test case of an op, used by the table-driven op tests.

    Args:
        inputs: host arrays, one per argument of ``build``.
        build: builds the op under test from graph tensors (inside a subgraph).
        reference: the same computation in eager torch, on torch tensors.
        grad: check the gradient of every floating point input against torch autograd.
        rtol, atol: tolerances of the comparison (float32 arithmetic).
    """

    inputs: Sequence[Any]
    build: Callable[..., Any]
    reference: Callable[..., Any]
    grad: bool = True
    rtol: float = 1e-5
    atol: float = 1e-6
    name: str = ""


def elementwise_cost(ins: Sequence[TensorSpec], outs: Sequence[TensorSpec], attrs) -> Cost:
    """One flop per output element; every input and output byte touched once."""
    nbytes = sum(s.nbytes for s in ins) + sum(s.nbytes for s in outs)
    return Cost(sum(s.nelms for s in outs), nbytes)


def no_cost(ins, outs, attrs) -> Cost:
    return Cost(0, 0)


def no_grad(ctx) -> list:
    """The gradient rule of an op with none to give: piecewise-constant ops (ceil, sign),
    boolean outputs (comparisons), random draws (the inputs give only shapes)."""
    return [None] * len(ctx.op.inputs)


def copy_cost(ins, outs, attrs) -> Cost:
    """Data movement (reshapes, slices, copies): every output byte read once and written once."""
    return Cost(0, 2 * sum(s.nbytes for s in outs))


# eq=False: a row is its identity (the sim's speed tables are keyed by it, and two rows
# with equal fields are still two op types)
@dataclass(frozen=True, eq=False)
class OpDef:
    """One row of the op table.

    Args:
        name: PopXL op type (what `print_schedule` shows), e.g. ``"MatMul"``.
        infer: ``(input_specs, **attrs) -> output specs``; raises ValueError on bad shapes.
        kernel: ``(*torch_inputs, **attrs) -> tensor | tuple``; the simulator's implementation.
        grad: ``(GradContext) -> [grad per input | None]``, built with our ops; None if the op
            has no gradient (integer outputs, state updates).
        cost: ``(input_specs, output_specs, attrs) -> Cost``.
        inplace: inputs the op writes to; output 0 aliases the first of them.
        view: the kernel may return a view of input 0 (the compiler copies when needed).
        samples: ``() -> [Sample]``; every registered op must have at least one.
        out_name: base name of output tensors (popxl names them ``<op>_out``).
        emit: custom code generator for control and IO ops (see sim/compile.py).
        fp16_in_fp32: compute float16 inputs in float32 and round the outputs.
        numerics_kernels: kernels that replace ``kernel`` under an `Ir.numerics` setting
            (e.g. MatMul's ``{"torch": ...}``); ``kernel`` is the default (``"ipu"``).
        side_effect: the op must run even when nothing reads its outputs.
        stops_gradient: autodiff passes no gradient through the op (detach).
        collective: the op exchanges data between replicas (the Session then runs the
            replicas in threads).
        ignores_inputs: the kernel reads none of its inputs' values (a host load fills its
            input), so dead-code removal keeps no producer alive for it.
        tested_by: the test that covers an op the table-driven op tests cannot run.
        reads_only: aliasing: the op neither writes its inputs nor returns anything sharing
            their storage (a host store copies), so an input may be reused after it.
        fresh_outputs: aliasing: the kernel returns new tensors that share storage with no
            input and no other output (batch norm's), so a later op may write into one of
            them once nothing reads it (as eager's ``relu_``).
        pointwise: the kernel computes each output element from the elements at the same
            index of its operands (operands of the output's shape, or broadcast), with
            arithmetic whose rounding torch's SIMD and scalar loops do differently (exp, tanh,
            gelu, ...); under ``Ir.numerics == "ipu"`` it runs padded so an element's result
            does not depend on the tensor's size (`_positional`).
        popxl_type: the op type PopXL gives this op where it differs from ``name``, the
            table's key: PopXL's ``matmul_pow2scaled`` makes a ``MatMul`` with a third
            (log2 scale) input, a different kernel here, so its row is ``MatMulPow2Scaled``
            with ``popxl_type="MatMul"``. `print_schedule` and ``Op.opType()`` show it.
        session_options: kernel keyword -> the `SessionOptions` attribute whose value the
            kernel takes (``ir._pb_ir.getSessionOptions()``, read when a Session compiles,
            `Op.kernel_attrs`): the float8 ops' ``throwIfLog2ScaleTensorNotInRange``.
        The simulator's speed variants of an op (multi-tensor groups, ``out=`` reuse, direct
        torch calls, replica folding and stacking, ...) are not fields: `popxl_core.sim.speed`
        keeps them in tables keyed by the row (``speed.declare(row, replica_fold=...)``).
    """

    name: str
    infer: Callable[..., Sequence[TensorSpec]]
    kernel: Optional[Callable[..., Any]] = None
    grad: Optional[Callable[..., Sequence[Optional[Tensor]]]] = None
    cost: Callable[..., Cost] = elementwise_cost
    inplace: Tuple[int, ...] = ()
    view: bool = False
    samples: Optional[Callable[[], List[Sample]]] = None
    out_name: str = ""
    emit: Optional[Callable[..., Any]] = None
    fp16_in_fp32: bool = True
    side_effect: bool = False
    numerics_kernels: Dict[str, Callable[..., Any]] = field(default_factory=dict)
    pointwise: bool = False
    stops_gradient: bool = False
    collective: bool = False
    ignores_inputs: bool = False
    tested_by: str = ""
    reads_only: bool = False
    fresh_outputs: bool = False
    popxl_type: str = ""
    session_options: Dict[str, str] = field(default_factory=dict)

    def __new__(cls, *args: Any, **fields: Any) -> "OpDef":
        # a speed variant given the old way would be a bare "unexpected keyword" TypeError:
        # say where it lives now (a row written for the old OpDef must not lose its rule)
        moved = sorted(fields.keys() & speed.TABLE_NAMES)
        if moved:
            name = args[0] if args else fields.get("name", "?")
            raise TypeError(
                f"OpDef({name!r}): {', '.join(moved)}: not a field of OpDef (what an op "
                "means); register the simulator's speed variant in its table after the row: "
                f"popxl_core.sim.speed.declare(ROW, {moved[0]}=...)."
            )
        return super().__new__(cls)

    # a row is an identity (tables are keyed by it): a copied graph or Ir keeps the rows
    def __copy__(self) -> "OpDef":
        return self

    def __deepcopy__(self, memo: Dict[int, Any]) -> "OpDef":
        return self

    def kernel_for(
        self, numerics: str, sizes: Optional[Sequence[int]] = None
    ) -> Optional[Callable[..., Any]]:
        """The kernel the simulator runs for an Ir whose ``numerics`` is ``numerics``;
        ``sizes``: the element counts of the op's inputs where the caller knows them (a
        pointwise op whose inputs need no padding then runs its kernel unwrapped)."""
        kernel = self.numerics_kernels.get(numerics, self.kernel)
        if numerics == "ipu" and self.pointwise and kernel is not None:
            if sizes is not None and all(runs_in_whole_blocks(n) for n in sizes):
                return kernel
            return _position_invariant(kernel, bool(self.inplace))
        return kernel


@functools.lru_cache(maxsize=None)
def _position_invariant(kernel: Callable[..., Any], inplace: bool) -> Callable[..., Any]:
    """One wrapper per kernel, so compiled programs bind the same function each time."""
    return position_invariant(kernel, inplace)


_TABLE: Dict[str, OpDef] = {}


def register(opdef: OpDef) -> OpDef:
    """Add a row to the op table; a type name can be declared only once."""
    if opdef.name in _TABLE:
        raise ValueError(f"Op type {opdef.name!r} is declared twice in the op table.")
    _TABLE[opdef.name] = opdef
    return opdef


def get_opdef(name: str) -> OpDef:
    try:
        return _TABLE[name]
    except KeyError:
        raise KeyError(f"No op type {name!r} in the op table.") from None


def all_opdefs() -> Dict[str, OpDef]:
    return dict(_TABLE)


def check_in_graph(graph: Graph, **tensors: Tensor) -> None:
    """Raise if any tensor is not in ``graph``, naming the argument and both graphs."""
    for arg, t in tensors.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"Argument {arg!r} must be a popxl.Tensor, got {type(t).__name__}.")
        if t.ir is not graph.ir:
            raise ValueError(
                f"Argument {arg!r} ({t.id!r}) belongs to {t.ir!r}, but the op is being created "
                f"in {graph.ir!r} (graph {graph.name or 'main'!r}). Tensors cannot be shared "
                "between Irs; create the tensor in this Ir."
            )
        if t.graph is not graph:
            raise ValueError(
                f"Argument {arg!r} ({t.id!r}) belongs to graph {t.graph.name or 'main'!r}, "
                f"but the op is being created in graph {graph.name or 'main'!r}. Pass the "
                "tensor into the subgraph as an input (graph_input / call inputs)."
            )
        if graph._tensors.get(t.id) is not t:
            raise ValueError(
                f"Argument {arg!r} ({t.id!r}) is no longer in graph {graph.name or 'main'!r}: a "
                "transform moved the op that made it (repeat_graph, pipelined_execution). Use "
                "tensors from before the transform only as its inputs."
            )


def check_tensor_ipu_and_tile_set(**tensors: Tensor) -> None:
    """Raise if the tensors made by ops are placed on different IPUs or tile sets.

    A tensor no op makes (a graph input, a constant, a variable) takes its place from the
    ops that read it, as in PopART, so it never conflicts: BERT's ``@popxl.io_tiles()``
    subgraph adds a constant made on the IO tiles to its graph input, which PopXL accepts.
    """
    placements = {(t.ipu, t.tile_set) for t in tensors.values() if t.producer is not None}
    if len(placements) > 1:
        where = ", ".join(f"{k}={t.id!r} on ipu {t.ipu}/{t.tile_set}" for k, t in tensors.items())
        raise ValueError(
            f"Op inputs are on different IPUs or tile sets: {where}. "
            "Use copy_to_ipu / io_tile_copy first."
        )


def create_op(
    opdef: OpDef | str,
    inputs: Sequence[Tensor],
    attrs: Optional[Dict] = None,
    *,
    called_graphs: Tuple[Graph, ...] = (),
    out_names: Optional[Sequence[str]] = None,
    graph: Optional[Graph] = None,
    check_placement: bool = True,
    out_ipus: Optional[Sequence[int]] = None,
) -> List[Tensor]:
    """Create an op in the current graph and return its output tensors.

    Validation (graph membership, shapes, dtypes) happens before anything is added, so a
    failure leaves the graph unchanged. ``out_ipus``: the IPU of each output, for an op that
    spans IPUs (PopART's ``getIntrospectionOutVirtualGraphId``); default: the op's IPU.
    """
    opdef = get_opdef(opdef) if isinstance(opdef, str) else opdef
    g = graph or gcg()
    attrs = dict(attrs or {})
    g.ir.check_editable("creating a %s op in graph %r", opdef.name, g.name or "main")
    _check_inputs(g, opdef, inputs, check_placement)
    specs = _infer(opdef, [t._spec for t in inputs], attrs, inputs)
    op = Op(g.ir._next_op_id(), opdef, g, list(inputs), attrs, tuple(called_graphs), opdef.name)
    names = (
        list(out_names)
        if out_names
        else [opdef.out_name or f"{opdef.name.lower()}_out"] * len(specs)
    )
    op.outputs = [
        Tensor._create(g, g._create_tensor_id(n), s, producer=op) for n, s in zip(names, specs)
    ]
    for t, ipu in zip(op.outputs, out_ipus or ()):
        t._ipu = int(ipu)
    g._add_op(op)
    get_current_context().op_created(op)
    return op.outputs


def _check_inputs(g: Graph, opdef: OpDef, inputs: Sequence[Tensor], placement: bool) -> None:
    """Raise unless every input is a tensor of ``g`` (and, with ``placement``, all the inputs
    that ops make sit on one IPU and tile set)."""
    # the checks name every input, so they run only when the quick test finds a problem
    # (every op of every build passes here: formatting the names each time is measurable)
    if not _all_in_graph(g, inputs):
        try:
            check_in_graph(g, **{f"{opdef.name} input {i}": t for i, t in enumerate(inputs)})
        except (TypeError, ValueError) as e:
            raise type(e)(f"{e}{_user_frame()}") from None
    if not placement:
        return
    placed = {(t._ipu, t._tile_set) for t in inputs if t._producer is not None}
    if len(placed) > 1:
        check_tensor_ipu_and_tile_set(**{f"input {i}": t for i, t in enumerate(inputs)})


def _all_in_graph(graph: Graph, inputs: Sequence[Tensor]) -> bool:
    """True when `check_in_graph` would pass for ``inputs`` (a tensor of ``graph`` is of its
    Ir and, unless a transform moved it, still registered there)."""
    tensors = graph._tensors
    return all(
        isinstance(t, Tensor) and t._graph is graph and tensors.get(t._id) is t for t in inputs
    )


def _infer(opdef: OpDef, specs: List[TensorSpec], attrs: Dict, inputs) -> List[TensorSpec]:
    try:
        out = opdef.infer(specs, **attrs)
    except (ValueError, TypeError, IndexError) as e:
        raise type(e)(f"{opdef.name}: {e} (inputs: {_describe(inputs)}){_user_frame()}") from None
    return list(out)


def _int_dims(shape: tuple) -> bool:
    return all(type(d) is int for d in shape)


def _describe(inputs: Sequence[Tensor]) -> str:
    return ", ".join(f"{t.id} {t.shape} {t.dtype.name}" for t in inputs) or "none"


def _user_frame() -> str:
    """The first stack frame outside this package: where the user created the op."""
    f: Optional[FrameType] = sys._getframe(1)
    pkg = __name__.rsplit(".", 2)[0]
    while f is not None and f.f_globals.get("__name__", "").startswith(pkg):
        f = f.f_back
    return f" [at {f.f_code.co_filename}:{f.f_lineno}]" if f is not None else ""


def broadcast_shapes(*shapes: Sequence[int]) -> Tuple[int, ...]:
    """numpy broadcasting of shapes; ValueError naming both shapes if incompatible."""
    first = shapes[0] if shapes else None
    if type(first) is tuple and all(s == first for s in shapes) and _int_dims(first):
        return first  # most elementwise ops: what numpy returns, without its ~5 us
    try:
        return tuple(np.broadcast_shapes(*[tuple(s) for s in shapes]))
    except ValueError:
        raise ValueError(
            f"shapes {' and '.join(str(tuple(s)) for s in shapes)} cannot be broadcast together"
        ) from None
