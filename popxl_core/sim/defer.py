"""The update's gradients freed when the next run starts, as eager frees ``.grad``.

A training step's weight gradients (resnet18: 11 M floats, 45 MB) are read last by the
optimizer update at the end of the step. Freed there (`release.py`), they leave the top of
glibc's heap free as the run returns; glibc gives the memory back to the kernel (heap trim)
and the next step faults it in again, page by page (resnet18 b16: 9,000-12,800 minor page
faults a step, about 1.9 us each here, where eager had 2,000-5,300). Eager keeps each
``.grad`` until ``zero_grad()`` at the start of the next step, so its forward allocates into
memory the heap still holds.

So in a graph that runs at most once per run (`variants.graphs_run_once`; a loop body would
pile up one set per iteration), the values a called graph returned (the backward's
gradients) whose last reader writes a variable in place (the optimizer update) are not
deleted but moved to
``Program.deferred``, which `Session` empties when the next run starts: memory held between
runs that eager holds too, and no page faults for it. The values are dead either way (the
update has read them), so the numbers are the same to the bit; only the time of a free moves.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Sequence, Set

from ..graph import Op
from ..tensor import Constant, Tensor, Variable

__all__ = ["DEFER_NAME", "deferred_at", "emit_deferred"]

DEFER_NAME = "DEFER"  # the generated code's global: `Program.deferred`


def _writes_variable(ops: Sequence[Op]) -> bool:
    """A kernel (not a call: its arguments may be handed over, handoff.py) writing a variable
    in place."""
    return any(
        not op.called_graphs and isinstance(op.inputs[i], Variable)
        for op in ops
        for i in op.modified_inputs()
    )


def _returned_by_call(t: Tensor) -> bool:
    """A value a called graph returned (the backward's gradients), not one the update's own
    ops made (Adam's weight-sized intermediates are freed as before: eager keeps none)."""
    src = t.producer
    return src is not None and bool(src.called_graphs) and not isinstance(t, (Constant, Variable))


def deferred_at(
    live: List[Op], released: Dict[int, List[Tensor]], emitted: Mapping[int, Sequence[Op]]
) -> Dict[int, Set[Tensor]]:
    """Index in ``live`` -> the released temporaries to defer there: inputs that a call
    returned (the gradients) of the op(s) ``emitted`` at that index when they write a
    variable in place."""
    out: Dict[int, Set[Tensor]] = {}
    for k, ts in released.items():
        ops = emitted.get(k, (live[k],))
        if not _writes_variable(ops):
            continue
        read = {t for op in ops for t in op.inputs}
        keep = {t for t in ts if t in read and _returned_by_call(t)}
        if keep:
            out[k] = keep
    return out


def emit_deferred(names: List[str], em) -> None:
    """The line handing ``names`` to ``Program.deferred`` (their ``del`` follows)."""
    if names:
        em.emit(f"{DEFER_NAME}.extend(({', '.join(names)},))")
