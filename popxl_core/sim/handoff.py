"""Call arguments handed over to the called graph, so it can free them as eager autograd does.

A called graph frees each temporary after its last reader (`release.py`), but an argument
stays referenced by the caller's local variable until the call returns. For a backward graph
that is every activation the forward saved: all of them lived until the whole backward had
run, then were freed at once. That raised the step's peak, and glibc gave the freed block back
to the kernel and faulted it in again on the next step (resnet18: 9,800 minor page faults a
step against eager's 2,300, whose autograd frees each saved tensor as soon as its gradient
node has run).

For a graph with one plain ``Call`` site in a graph that runs once per run (`variants.
graphs_run_once`), the call site puts the arguments in a list, deletes its own names of those
whose last reader is the call, and passes the list; the called function unpacks the list and
clears it, so its locals hold the only references and its ``del`` lines free them. Same
kernels, same values: only the time of each free changes.
"""

from __future__ import annotations

from typing import List, Sequence

from ..graph import Graph, Op

__all__ = ["HANDOFF_PARAM", "handoff_graph", "emit_handoff_call", "unpack_lines"]

HANDOFF_PARAM = "_H"


def handoff_graph(program, g: Graph) -> bool:
    """Whether ``g`` takes its arguments as a handed-over list: it runs once per run from one
    Call site, under the table kernels (torch.compile's graphs keep the plain signature)."""
    options = program.options
    return (
        options.handoff
        and not options.inductor
        and g is not program.ir.main_graph
        and g in program.once
    )


def unpack_lines(params: Sequence[str]) -> List[str]:
    """The first lines of a handed-over graph: its parameters from the list, then the list
    emptied (the caller's names of the dead arguments are already gone)."""
    if not params:
        return []
    return [f"{', '.join(params)}, = {HANDOFF_PARAM}", f"{HANDOFF_PARAM}.clear()"]


def emit_handoff_call(op: Op, args: List[str], dead: Sequence[str], em) -> None:
    """``outs = fn([args])`` with the caller's names of ``dead`` (last read here) deleted
    before the call."""
    fn = em.graph_fn(op.called_graphs[0])
    outs = [em.name(t) for t in op.outputs]
    em.emit(f"{HANDOFF_PARAM} = [{', '.join(args)}]")
    if dead:
        em.emit(f"del {', '.join(dead)}")
    call = f"{fn}({HANDOFF_PARAM})"
    em.emit(
        f"{', '.join(outs)}{',' if len(outs) == 1 else ''} = {call}[:{len(outs)}]" if outs else call
    )
