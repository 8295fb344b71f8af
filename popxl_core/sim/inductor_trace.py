"""The fast mode's whole step traced by ``make_fx`` and handed to inductor (``compile_fx``),
with no dynamo in between.

torch.compile's dynamo interprets the bytecode of every table kernel the step calls, on every
build (a warm build of resnet18's step spent 3.0 s there, against torch.compile's 1.8 s for
its whole warm build of eager's module), and checks its guards on every call of the step.
The step's Python is already straight-line calls of torch kernels on tensors of fixed shape,
so tracing it at the dispatcher (``make_fx`` on fake tensors: each aten op a node, no
bytecode, no data) gives the FX graph dynamo and AOT autograd would reach, in a fraction
of the time. Inductor's caches then key on that graph, which is the same in every process
for the same program: a warm build is the trace and a cache lookup.

What dynamo's guards did is kept as one C++ check per step (``TensorGuards``: dtype, device,
shape and strides of every input): a changed input (a variable the user replaced with a
tensor of other strides) traces and compiles again, as dynamo recompiles. A kernel whose
Python branches on data (no fake tensor can answer) cannot be traced so: that step goes to
``torch.compile`` as before, graph breaks and all.
"""

from __future__ import annotations

import operator
import threading
from typing import Callable, Dict, List, Optional, Sequence

import torch
from torch._C._dynamo.guards import TensorGuards
from torch._inductor.compile_fx import compile_fx
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    UnsupportedOperatorException,
)
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

from .inductor import OPTIONS

__all__ = ["UNTRACEABLE", "TracedStep", "trace_step"]

# what a fake tensor cannot answer: a value (``.item()``, ``bool(t)``), a shape that depends
# on data (``nonzero``), an op with no fake kernel
UNTRACEABLE = (
    GuardOnDataDependentSymNode,
    DataDependentOutputException,
    DynamicOutputShapeException,
    UnsupportedOperatorException,
)

# one trace at a time: replicas run as threads (runtime.run_replicas), and the trace sets
# torch.compiler's process-wide "compiling" flag
_BUILDING = threading.Lock()


def trace_step(fn: Callable, args: Sequence[torch.Tensor]) -> torch.fx.GraphModule:
    """``fn(*args)`` as an aten-level FX graph, traced on fake tensors. The kernels see
    ``torch.compiler.is_compiling()`` true, as under torch.compile: they take their in-graph
    forms (a label check as an assertion in the graph, a scalar kept a tensor). Constant
    tensors the step reads (a gradient's seed) are real: they become the graph's constants."""
    with torch.compiler._compile_session_context():
        return make_fx(fn, tracing_mode="fake", _allow_non_fake_inputs=True)(*args)


def _getter(used: List[int]) -> Callable[[list], list]:
    """The variables the step reads, out of ``V``, in one C call."""
    if not used:
        return lambda V: []
    pick = operator.itemgetter(*used)
    if len(used) == 1:
        return lambda V: [pick(V)]
    return lambda V: list(pick(V))


class TracedStep:
    """``main_step(V, L)`` (inductor_step.py) compiled by inductor from its ``make_fx`` trace
    on its first call; traced and compiled again where an input's dtype, shape or strides
    change. ``stats["inductor_traces"]`` counts the compilations; a step that cannot be traced
    runs under ``torch.compile`` instead (``stats["inductor_dynamo"]``)."""

    def __init__(self, step: Callable, stats: Dict[str, int]) -> None:
        self.step, self.stats = step, stats
        self.compiled: Optional[Callable] = None
        self.guards: Optional[TensorGuards] = None
        self.pick: Callable[[list], list] = list
        self.dynamo: Optional[Callable] = None  # the fallback: torch.compile of the step

    def __call__(self, V: list, L: list):
        if self.dynamo is not None:
            return self.dynamo(V, L)
        args = [*self.pick(V), *L]
        if self.guards is None or not self.guards.check(*args):
            with _BUILDING:
                args = self._build(V, L)
            if self.dynamo is not None:
                return self.dynamo(V, L)
        assert self.compiled is not None  # made by _build, or the fallback returned above
        return self.compiled(*args)

    def _build(self, V: list, L: list) -> list:
        """Trace and compile for these inputs; the arguments the compiled step takes."""
        used = [i for i, t in enumerate(V) if isinstance(t, torch.Tensor)]
        self.pick = _getter(used)
        args = [*self.pick(V), *L]
        try:
            gm = trace_step(_flat(self.step, used, len(V)), args)
        except UNTRACEABLE:  # a branch on data: dynamo splits the step there instead
            self.dynamo = torch.compile(self.step, dynamic=False, options=OPTIONS)
            self.stats["inductor_dynamo"] = 1
            return args
        self.compiled = compile_fx(gm, args, config_patches=OPTIONS)
        self.guards = TensorGuards(*args, dynamic_dims_sizes=None, dynamic_dims_strides=None)
        self.stats["inductor_traces"] = self.stats.get("inductor_traces", 0) + 1
        return args


def _flat(step: Callable, used: List[int], n: int) -> Callable:
    """``step(V, L)`` as a function of the read variables then the loads, one argument each
    (what make_fx and inductor take); the variables the step does not read are None."""
    k = len(used)

    def flat(*args):
        V: list = [None] * n
        for i, t in zip(used, args[:k]):
            V[i] = t
        return step(V, list(args[k:]))

    return flat
