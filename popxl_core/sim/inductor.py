"""The opt-in fast mode's per-graph path: a compiled program's called graphs handed to
torch.compile (inductor), for programs whose step cannot be compiled whole (inductor_step.py:
a random draw, a collective, a remote transfer).

``CompileOptions(inductor=True)`` (popxl_fx: ``Options(kernels="inductor")``) compiles
the program as usual, then replaces the generated function of every *pure* called graph (the
forward and backward graphs of a traced model) with ``torch.compile(fn, dynamic=False)``
(with inductor's C++ wrapper, ``cpp_wrapper``):
dynamo traces the table kernels it calls into one FX graph and inductor fuses its elementwise
chains into generated C++ loops. The main graph (host streams, the optimizer update, variable
writes) keeps the table kernels, so the weight update is the default program's arithmetic on
the gradients inductor computes.

Inductor's fused loops round differently from eager's kernels (reassociated reductions,
vectorised transcendental functions): results are within a stated tolerance of the default
program, not bit for bit (tests/test_inductor_kernels.py). The default is unchanged; the
reference interpreter has no such mode. A graph is pure when it reads no host stream, runs no
collective or remote transfer, draws no random numbers and writes none of its inputs:
compiling it cannot change what it does besides rounding. Graphs that are not pure keep
their table kernels.
"""

from __future__ import annotations

from typing import Callable, List

import torch

from ..graph import Graph

__all__ = ["OPTIONS", "compile_pure_graphs", "is_pure", "named_errors"]

# inductor's C++ wrapper: a compiled graph's buffer allocations and kernel calls run in C++,
# not in a generated Python function (GPT step 1.05-1.08 -> 0.97-1.03 of the torch.compile
# twin's, measured side by side; benchmarks/RESULTS.md gives the compile time)
# inductor's layout optimisation off: with it, a graph with convolutions runs them on
# channels-last copies (a conversion per convolution and step) and its generated loops over
# those layouts; off, convolutions keep eager's NCHW oneDNN calls. resnet18 b16, thread CPU
# time: whole step 338 ms with it, 208 ms without (two runs; the per-graph path timed beside
# it in each: 229 and 216 ms), 2026-12-07 on a loaded 2-core Xeon
OPTIONS = {"cpp_wrapper": True, "layout_optimization": False}


def is_pure(g: Graph, source: str) -> bool:
    """No op with a side effect (streams, collectives, random draws, remote buffers), no
    write to an input or a variable, and no call of another graph (compiled on its own)."""
    if "RT." in source:  # the runtime: streams, collectives, Streaming Memory
        return False
    for op in g._ops:
        if op.opdef.side_effect or op.modified_inputs() or op.called_graphs:
            return False
    return True


def named_errors(fn: Callable, g: Graph) -> Callable:
    """Inductor's generated code checks indices (a label, a gather index) itself, and its
    message names a temporary of the generated C++; say which graph it was and how to find
    the op."""

    def run(*args):
        try:
            return fn(*args)
        except RuntimeError as e:
            raise RuntimeError(
                f"graph {g.name!r} compiled by inductor (Options(kernels='inductor')) failed: "
                f"{e}. An index out of bounds is data out of range (a label >= the class "
                "count, an embedding index >= its rows); with kernels='table' the error names "
                "the op and the value."
            ) from e

    return run


def compile_pure_graphs(program) -> List[Graph]:
    """Replace each pure called graph's function in ``program``'s namespace (where callers
    look it up at run time) with its ``torch.compile``d version; returns those graphs.
    Compilation itself happens on the first run (as torch.compile's does)."""
    done = []
    for g, compiled in program.graphs.items():
        if not is_pure(g, compiled.source):
            continue
        name = program.fn_name(g)
        fn = torch.compile(compiled.fn, dynamic=False, options=OPTIONS)
        program.namespace[name] = named_errors(fn, g)
        done.append(g)
    program.stats["inductor_graphs"] = len(done)
    return done
