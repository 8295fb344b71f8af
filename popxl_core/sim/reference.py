"""A plain interpreter of an Ir: the reference the compiled program is tested against.

`ReferenceProgram` walks each graph's schedule op by op, every time it runs, and calls each
op's kernel from the op table on values kept in a dictionary. It does none of what the compiler
(`compile.Program`) does for speed: no dead-code removal, no fused kernels (`fuse.py`,
`foreach.py`), no ``out=`` buffer reuse (`inplace.py`), no torch calls written into
generated code (`direct.py`) and no views handed out: every output of a non-in-place view op
is a copy. What stays is the semantics every backend shares: an op's
kernel with its attributes, float16 computed in float32 and rounded (``fp16_in_fp32``), narrow
unsigned integers computed in int64, in-place ops writing their target, and the control, IO,
remote and collective ops' own emitters (the definition of call-by-value, streams and
exchanges), whose called graphs are interpreted here too.

``Session(ir, ..., compile_options=CompileOptions(interpret=True))`` runs the Ir with this
interpreter instead (popxl_fx: ``Options(compiler=CompileOptions(interpret=True))``).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List

import torch

from ..graph import Graph, Op
from ..host_data import host_to_torch
from ..schedule import schedule
from ..tensor import Constant, Tensor, Variable
from .code_cache import compiled as compiled_code
from .compile import _modified_graph_inputs, is_remote
from .kernel_wrappers import (
    fp16_in_fp32,
    fp16_via_fp32,
    touches_narrow_unsigned,
    unsigned_via_int64,
)

__all__ = ["ReferenceProgram"]


class _Main:
    """``main.fn(V)`` as on a compiled program: run the main graph on variable values ``V``."""

    def __init__(self, program: "ReferenceProgram") -> None:
        self.graph = program.ir.main_graph
        self.fn = program.run_main


class _ModifiedInputs(dict):
    """Graph -> indexes of the inputs it writes, computed when an emitter first asks."""

    def __missing__(self, g: Graph):
        self[g] = _modified_graph_inputs(g)
        return self[g]


class ReferenceProgram:
    """Interprets the graphs of ``ir``; the same interface as `compile.Program` for Session."""

    def __init__(self, ir, runtime: Any, check_specs: bool = False) -> None:
        self.ir = ir
        self.runtime = runtime
        self.check_specs = check_specs
        self.variables: List[Variable] = [v for v in ir.main_graph.variables if not is_remote(v)]
        self.modified_inputs: Dict[Graph, set] = _ModifiedInputs()
        self.kernel_ops: Dict[str, Op] = {}
        self._constants: Dict[Tensor, torch.Tensor] = {}
        self._emitted: Dict[Op, Callable] = {}
        self.main = _Main(self)

    def graphs_used(self) -> List[Graph]:
        """The main graph and every graph it calls, directly or not."""
        seen: List[Graph] = []
        stack = [self.ir.main_graph]
        while stack:
            g = stack.pop()
            if g in seen:
                continue
            seen.append(g)
            stack.extend(c for op in g._ops for c in op.called_graphs)
        return seen

    # running -------------------------------------------------------------------------
    def run_main(self, values: List[torch.Tensor]) -> tuple:
        env: Dict[Tensor, Any] = dict(zip(self.variables, values))
        return self._run(self.ir.main_graph, env)

    def run_graph(self, g: Graph, *args: torch.Tensor) -> tuple:
        """Run subgraph ``g`` on its input values; returns its output values."""
        return self._run(g, dict(zip(g._inputs, args)))

    def _run(self, g: Graph, env: Dict[Tensor, Any]) -> tuple:
        for op in schedule(g):
            for t in op.inputs:
                if t not in env:
                    env[t] = self._constant(t)
            if op.opdef.emit is not None:
                self._emitted_fn(op)(env)
            else:
                self._run_kernel(op, env)
        return tuple(env[t] if t in env else self._constant(t) for t in g._outputs)

    def _constant(self, t: Tensor) -> torch.Tensor:
        if not isinstance(t, Constant):
            raise RuntimeError(f"{t.id!r} is read before any op produced it.")
        if t not in self._constants:
            self._constants[t] = host_to_torch(t._data.copy())
        return self._constants[t]

    def _run_kernel(self, op: Op, env: Dict[Tensor, Any]) -> None:
        res = plain_kernel(op)(*[env[t] for t in op.inputs])
        outs = res if isinstance(res, tuple) else (res,)
        if op.opdef.view and not op.opdef.inplace:
            outs = tuple(r.clone() for r in outs)  # a new tensor, as the op's semantics say
        if self.check_specs:
            _check_specs(op, outs)
        for t, r in zip(op.outputs, outs):
            env[t] = r

    def _emitted_fn(self, op: Op) -> Callable:
        if op not in self._emitted:
            self._emitted[op] = _OpEmitter(self, op).function()
        return self._emitted[op]


def plain_kernel(op: Op) -> Callable:
    """``op``'s table kernel (for its Ir's ``numerics``) with its attributes, and the dtype
    rules every backend applies."""
    kernel = op.opdef.kernel_for(op.graph.ir.numerics)
    if kernel is None:
        raise RuntimeError(f"{op.type}.{op.id} has no kernel and no emitter in the op table.")
    attrs = op.kernel_attrs()
    if attrs:
        kernel = functools.partial(kernel, **attrs)
    if fp16_in_fp32(op):
        kernel = fp16_via_fp32(kernel, op)
    if not op.opdef.view and touches_narrow_unsigned(op):
        kernel = unsigned_via_int64(kernel, op)
    return kernel


def _check_specs(op: Op, outs) -> None:
    want = [(tuple(t.shape), t.dtype.as_torch()) for t in op.outputs]
    have = [(tuple(r.shape), r.dtype) for r in outs] if op.outputs else []
    if have != want:
        raise AssertionError(f"{op.type}.{op.id}: kernel produced {have}, inferred {want}")


class _OpEmitter:
    """Runs one control/IO/remote/collective op through its own ``OpDef.emit``: the emitted
    lines read and write the interpreter's environment (``E[T[i]]``), and a called graph is a
    function that interprets that graph."""

    def __init__(self, program: ReferenceProgram, op: Op) -> None:
        self.program = program
        self.graph = op.graph
        self.op = op
        self.lines: List[str] = []
        self.tensors: List[Tensor] = []
        self.namespace: Dict[str, Any] = {"RT": program.runtime, "torch": torch}

    def name(self, t: Tensor) -> str:
        if t not in self.tensors:
            self.tensors.append(t)
        return f"E[T[{self.tensors.index(t)}]]"

    def bind_global(self, prefix: str, value: Any) -> str:
        name = f"{prefix}{len(self.namespace)}"
        self.namespace[name] = value
        return name

    def emit(self, line: str) -> None:
        self.lines.append(line)

    def graph_fn(self, g: Graph) -> str:
        return self.bind_global("graph_", functools.partial(self.program.run_graph, g))

    def function(self) -> Callable[[Dict[Tensor, Any]], None]:
        emit = self.op.opdef.emit
        assert emit is not None  # the interpreter emits only ops with an emitter
        emit(self.op, self)
        self.namespace["T"] = self.tensors
        body = "\n    ".join(self.lines) or "pass"
        source = f"def op(E):\n    {body}\n"
        where = f"<popxl reference {self.op.type}.{self.op.id}>"
        exec(compiled_code(source, where), self.namespace)
        return self.namespace["op"]
