"""The fast mode's whole step: the compiled main program handed to inductor as one function.

torch.compile of an eager training step sees forward, backward and (when the optimizer is
compiled too) the update in one trace. The per-graph path (inductor.py) compiled the forward
and backward graphs apart and ran the update with table kernels: two compilations, and graph
breaks between forward, backward and update, each a boundary no fusion crosses and a Python
call per step. Here the main graph's generated function is rewritten so that it touches no
runtime object: its host stream reads become an input list ``L`` (read before the step, in
their order, so each stream's transfers keep their order), its host stream writes become its
outputs (written after the step), and the variables stay the list ``V`` it is given, written
in place (AOT autograd functionalises the mutation of inputs and inductor writes them back).
The trace (inductor_trace.py: ``make_fx``, no dynamo) runs through the called graphs'
functions, so forward, backward and update are one FX graph and one inductor compilation,
cached on disk across processes as torch.compile's are (inductor's FX graph cache keys on the
graph, not on this process).

Only programs whose every side effect is a host stream transfer of the main graph are compiled
so: a collective, a remote transfer, a random draw, a runtime check or a stream read inside a
called graph (a loop's per-iteration data) keeps the per-graph path, as does a replicated
program whose replicas share work (uniform.py).
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from typing import Callable, List, Optional, Tuple

from ..ops.io import HOST_LOAD, HOST_STORE
from .inductor import named_errors
from .options import CompileOptions

__all__ = ["compilable", "compile_step", "only_transfers", "step_options", "step_source"]

_LOAD = re.compile(r"(v\d+) = RT\.load\((s\d+)\)")
_SKIP = re.compile(r"RT\.skip\((s\d+)\)")
_STORE = re.compile(r"RT\.store\((s\d+), (v\d+)\)")
_HEAD, _TAIL = "def main(V):", "return ()"
_NAMES = itertools.count()  # each step its own code object, named in tracebacks

# (stream global, read) per host transfer in order; stream globals written, in order
Transfers = List[Tuple[str, bool]]


def step_source(source: str) -> Optional[Tuple[str, Transfers, List[str]]]:
    """``source`` (the main graph's function) as ``main_step(V, L)``: the transfers it made,
    and the streams its outputs go to; None where it touches the runtime otherwise."""
    lines = source.rstrip("\n").split("\n")
    if lines[0] != _HEAD or lines[-1].strip() != _TAIL:
        return None
    body: List[str] = []
    transfers: Transfers = []
    stores: List[str] = []
    for line in lines[1:-1]:
        indent = line[: len(line) - len(line.lstrip())]
        new = _step_line(line.strip(), transfers, stores)
        if new is None or (new != line.strip() and indent != "    "):
            return None  # a transfer inside a loop runs once per iteration: not hoisted
        if new:
            body.append(indent + new)
    outs = "".join(f"O{i}, " for i in range(len(stores)))
    text = "\n".join(["def main_step(V, L):", *body, f"    return ({outs})"])
    return text + "\n", transfers, stores


def _step_line(line: str, transfers: Transfers, stores: List[str]) -> Optional[str]:
    """One line of the step: a load reads ``L``, a skip goes, a store names an output (a copy:
    the value as the store saw it, whatever later lines write); None: not compilable."""
    if m := _LOAD.fullmatch(line):
        transfers.append((m[2], True))
        return f"{m[1]} = L[{sum(read for _, read in transfers) - 1}]"
    if m := _SKIP.fullmatch(line):
        transfers.append((m[1], False))
        return ""
    if m := _STORE.fullmatch(line):
        stores.append(m[1])
        return f"O{len(stores) - 1} = {m[2]}.clone()"
    return None if "RT." in line or "DEFER" in line else line


def only_transfers(ir) -> bool:
    """No side effect in ``ir``'s step but the main graph's host transfers."""
    main, seen, todo = ir.main_graph, set(), [ir.main_graph]
    while todo:
        g = todo.pop()
        seen.add(g)
        for op in g._ops:
            if op.opdef.side_effect and not (g is main and op.opdef in (HOST_LOAD, HOST_STORE)):
                return False
            todo.extend(c for c in op.called_graphs if c not in seen)
    return True


def step_options(ir, options: CompileOptions) -> CompileOptions:
    """The compile passes for a step compiled whole: no multi-tensor groups (inductor fuses
    each op's loop itself; a foreach op with a scalar tensor reads it with ``.item()``, a
    graph break, and its combined kernel takes inductor's scheduler seconds) and no release
    deferred to the next run (defer.py: inductor frees its temporaries itself)."""
    if not (options.inductor and only_transfers(ir)):
        return options
    return dataclasses.replace(options, foreach=False, defer_release=False)


def compilable(program) -> bool:
    """No side effect but the main graph's host transfers, and one run of the main function
    per replica (no work shared between replicas, no folded run)."""
    if program.fold is not None or program.sharing is not None:
        return False
    if not only_transfers(program.ir):
        return False
    return all("RT." not in c.source for c in program.graphs.values())


def compile_step(program) -> bool:
    """Replace ``program``'s main function with one that runs the whole step compiled by
    inductor (inductor_trace.py); False (nothing changed) where the program is not
    `compilable`."""
    made = step_source(program.main.source) if compilable(program) else None
    if made is None:
        return False
    source, transfers, stores = made
    name = f"<popxl step {next(_NAMES)}>"
    exec(compile(source, name, "exec"), program.namespace)
    # imported here, as the fast mode is chosen: inductor_trace imports torch._inductor and
    # torch._dynamo, ~2.5 s of CPU a process that builds only default-mode programs never uses
    from .inductor_trace import TracedStep

    traced = TracedStep(program.namespace["main_step"], program.stats)
    step = named_errors(traced, program.ir.main_graph)
    program.main.fn = _runner(step, program.namespace, transfers, stores)
    program.stats["inductor_step"], program.stats["inductor_graphs"] = 1, 0
    return True


def _runner(step: Callable, namespace: dict, transfers: Transfers, stores: List[str]) -> Callable:
    """``main(V)``: the host reads, the compiled step, the host writes."""
    rt = namespace["RT"]
    reads = [(namespace[s], read) for s, read in transfers]
    writes = [namespace[s] for s in stores]

    def main(V):
        loaded = [rt.load(s) if read else rt.skip(s) for s, read in reads]
        outs = step(V, [t for t in loaded if t is not None])
        for s, value in zip(writes, outs):
            rt.store(s, value)
        return ()

    return main
