"""Out-of-memory diagnosis: what overflowed, what was live at the peak and what would help.

On "ipu_hw" the Session raises `OutOfMemoryError` at construction, before any step runs; on
"ipu_model" (which, like Poplar's IPU Model, never stops on OOM) it warns with the same text.
"""

from __future__ import annotations

import heapq

from .liveness import TOP_N
from .units import fmt_bytes

__all__ = ["OutOfMemoryError", "OutOfMemoryWarning", "oom_message", "remedies"]


class OutOfMemoryError(MemoryError):
    """The estimated memory of an IPU exceeds its capacity on a target where that is fatal.

    ``plan`` holds the full estimate; ``plan.report().summary()`` prints it.
    """

    def __init__(self, message: str, plan=None) -> None:
        super().__init__(message)
        self.plan = plan


class OutOfMemoryWarning(UserWarning):
    """The estimate exceeds an IPU's capacity on a target that does not stop ("ipu_model")."""


def remedies(plan, ipu: int) -> list[str]:
    """Transforms that shrink the categories that fill ``ipu``, the largest category first."""
    m = plan.memory[ipu]
    replicas = plan.replication_factor
    rts = (
        "replicated tensor sharding (RTS: sharded weights and optimiser state take "
        f"ceil(n/R) elements per replica{'' if replicas > 1 else '; needs replication'})"
    )
    by_category = {
        "variables": [
            "remote variables with phased execution (on-chip weights become the largest "
            "phase's instead of the sum)",
            rts,
        ],
        "activations": [
            "recomputation (keep fewer activations for the backward pass)",
            "batch serialisation (activations of one slice of the batch at a time)",
            "a smaller micro-batch with gradient accumulation",
        ],
        "code": [
            "outlining repeated layers (a graph's code is counted once, however often called)",
            "remote code loading (code live only between its load and its last call)",
        ],
        "constants": ["variables instead of large constants, with remote variables"],
        "streams": ["fewer or smaller host streams (load larger batches less often)"],
    }
    sizes = {
        "variables": m.variables,
        "activations": m.activations,
        "code": m.code,
        "constants": m.constants,
        "streams": m.streams,
    }
    ranked = sorted((c for c in sizes if sizes[c] > 0), key=lambda c: -sizes[c])
    return [r for c in ranked if sizes[c] >= 0.1 * m.total for r in by_category[c]]


def _closing(fatal: bool) -> str:
    if fatal:
        return (
            "  Device 'ipu_model' reports OOM without stopping. The full estimate is in "
            "this error's .plan.report()."
        )
    return (
        "  'ipu_hw' would stop here; this target runs on. The full estimate is in session.report."
    )


def oom_message(plan, ipu: int, fatal: bool = True) -> str:
    """The user-facing text for ``ipu`` of ``plan`` overflowing its capacity (``fatal``: for
    the error, else for the warning)."""
    m, mc = plan.memory[ipu], plan.machine
    return "\n".join(
        [
            f"Out of memory on IPU {ipu} of {mc.name!r} (estimate): the peak needs "
            f"{fmt_bytes(m.total)}, the IPU has {fmt_bytes(m.capacity)} "
            f"({mc.tiles_per_ipu} tiles x {fmt_bytes(mc.bytes_per_tile)}), "
            f"over by {fmt_bytes(m.total - m.capacity)}.",
            f"  Always-live {fmt_bytes(m.always_live)}: variables {fmt_bytes(m.variables)}, "
            f"constants {fmt_bytes(m.constants)}, code {fmt_bytes(m.code)}, stream buffers "
            f"{fmt_bytes(m.streams)}. Not-always-live peak {fmt_bytes(m.activations)}"
            f"{_where(plan, ipu)}.",
            *_largest_variables(plan, ipu),
            *_largest_live(m),
            "  What would help: " + "; ".join(remedies(plan, ipu) or ["a bigger target"]) + ".",
            _closing(fatal),
        ]
    )


def _where(plan, ipu: int) -> str:
    live = plan.liveness
    step = live.peak_step.get(ipu)
    return "" if step is None else f" at main-graph step {step} ({live.steps[step]})"


def _largest_variables(plan, ipu: int) -> list[str]:
    kinds = {
        "variables": "variable",
        "constants": "constant",
        "streams": "stream buffer",
        "code": "code of",
    }
    found = [(kinds[c], name, b) for c, name, b in plan.memory[ipu].top if c in kinds]
    if not found:
        return []
    return [
        "  Largest always-live items: "
        + ", ".join(f"{kind} {name!r} {fmt_bytes(b)}" for kind, name, b in found)
        + "."
    ]


def _largest_live(m) -> list[str]:
    if not m.live_top:
        return []
    parts = []
    for t in heapq.nlargest(TOP_N, m.live_top, key=lambda x: x.nbytes):
        torch_path = f", torch module {t.module_path!r}" if t.module_path else ""
        parts.append(
            f"{t.name!r} {fmt_bytes(t.nbytes)} (made by {t.op} in graph {t.graph!r}{torch_path})"
        )
    return ["  Largest tensors live at the peak: " + ", ".join(parts) + "."]
