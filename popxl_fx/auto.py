"""``Options(memory="auto")``: find options under which a training program fits one IPU.

`choose` first plans the options as given: a model that fits (with `MARGIN` to spare) is left
unchanged. Otherwise it plans every candidate of `candidates` -- phased execution (the modules
marked with `popxl_fx.phase`, the repeated blocks, or the top-level children), with replicated
tensor sharding when the program is replicated, outlining with recomputation, gradient
accumulation -- and, when none of those fits, `sliced_candidates`: phased execution with
gradient accumulation (each phase then holds one micro-batch's activations) -- each a what-if
build on weightless variables (broadcast zeros: no weight copies, no host memory for them) that
stops at the simulator's plan, and keeps the candidate that fits with the lowest estimated step
time. When none fits, `NoPlanFitsError` gives the best plan's
shortfall and every candidate's peak. The what-if builds and the chosen one share their
captures (the trainer's `capture_cache.SharedCaptures`): a candidate traces only what no
earlier build traced (another micro-batch, another split into phases).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from popxl_core.sim.machine import machine_for
from popxl_core.sim.report import fmt_bytes

from .options import Options
from .outline import candidates as repeated
from .phases import marked

__all__ = [
    "MARGIN",
    "Choice",
    "NoPlanFitsError",
    "Planned",
    "candidates",
    "choose",
    "sliced_candidates",
]

MARGIN = 0.05  # a plan fits when its peak leaves this share of the IPU's memory free


class NoPlanFitsError(MemoryError):
    """``memory="auto"`` found no candidate whose peak fits one IPU."""


@dataclass(frozen=True)
class Planned:
    """One candidate's plan: its options, peak bytes per IPU and estimated cycles per step."""

    options: Options
    peak: int
    cycles: int

    def describe(self, changes: dict) -> str:
        return f"{_text(changes)}: peak {fmt_bytes(self.peak)}, {self.cycles:,} cycles per step"


@dataclass(frozen=True)
class Choice:
    """What `choose` decided: the options to build with and the text explaining it."""

    options: Options
    text: str


def _text(changes: dict) -> str:
    if not changes:
        return "Options as given"
    return "Options(" + ", ".join(f"{k}={v!r}" for k, v in changes.items()) + ")"


def candidates(model: nn.Module, options: Options, batch: int | None) -> list[dict]:
    """The option changes `choose` tries, in order (each a dict of `Options` fields)."""
    found: list[dict] = []
    rts = {"replicated_tensor_sharding": True} if options.replication_factor > 1 else {}
    blocks = bool(repeated(model))
    kinds: tuple[str, ...] = ("marked",) if marked(model) else ()  # the user's own phases first
    kinds += ("blocks", "children") if blocks else ("children",)
    for kind in kinds:
        found.append({"phased_execution": kind})
        if rts:
            found.append({"phased_execution": kind, **rts})
    if rts:
        found.append(dict(rts))
    if blocks:
        found.append({"outline": "auto", "recompute": True})
    for k in _dividing(options, batch):
        found.append({"gradient_accumulation": k})
    return found


def sliced_candidates(model: nn.Module, options: Options, batch: int | None) -> list[dict]:
    """The second round, tried when no plan of `candidates` fits: phased execution with
    gradient accumulation, each phase then holding one micro-batch's activations (the rest
    wait in Streaming Memory, `phased_slices`). Batch serialisation cuts a phased program's
    batch into the same slices, with the same peak: accumulation stands for both."""
    found: list[dict] = []
    for phased in [c for c in candidates(model, options, batch) if "phased_execution" in c]:
        for k in _dividing(options, batch):
            found.append({**phased, "gradient_accumulation": k})
    return found


def _dividing(options: Options, batch: int | None) -> list[int]:
    """The slice counts (2, 4) that divide ``batch`` on top of the options' own split."""
    return [k for k in (2, 4) if batch is not None and batch % (k * options.batch_divisor) == 0]


def choose(
    model: nn.Module,
    options: Options,
    plan: Callable[[Options], Planned],
    batch: int | None = None,
) -> Choice:
    """The options to train ``model`` with under ``options.memory == "auto"``.

    A candidate that does not apply to the model (its build refuses it: phases that forward
    never calls, options that do not combine) is skipped and listed with the reason; it never
    ends the search.

    Args:
        plan: a what-if build of the training program for the given options (no Session).
        batch: the batch size (gradient accumulation is tried where it divides it).
    """
    capacity = machine_for(options.device).bytes_per_ipu
    limit = int(capacity * (1 - MARGIN))
    base = options.replace(memory={})
    given = plan(base)
    if given.peak <= limit:
        return Choice(base, f"memory='auto': the model fits as given ({_fits(given, capacity)})")
    search = _Search(plan, base, limit, [({}, given)])
    search.run(candidates(model, options, batch))
    if not search.fitting():  # activations too: phases that hold one slice of the batch
        search.run(sliced_candidates(model, options, batch))
    fitting = search.fitting()
    if not fitting:
        raise NoPlanFitsError(_none_fits(search, capacity, limit))
    changes, best = min(fitting, key=lambda cp: cp[1].cycles)
    lines = [f"memory='auto' chose {_text(changes)} ({_fits(best, capacity)}); planned:"]
    lines += [
        f"  {p.describe(c)}" + ("  <- chosen" if c is changes else "") for c, p in search.tried
    ]
    return Choice(best.options, "\n".join(lines + search.skipped_lines()))


@dataclass
class _Search:
    """The candidates planned so far, and those skipped because they do not apply."""

    plan: Callable[[Options], Planned]
    base: Options
    limit: int
    tried: list
    skipped: list = field(default_factory=list)  # (changes, why)

    def run(self, changes_list: list[dict]) -> None:
        for changes in changes_list:
            try:
                self.tried.append((changes, self.plan(self.base.replace(**changes))))
            except _DOES_NOT_APPLY as e:  # the given options planned: the candidate is refused
                self.skipped.append((changes, f"{type(e).__name__}: {e}"))

    def fitting(self) -> list:
        return [(c, p) for c, p in self.tried if p.peak <= self.limit]

    def skipped_lines(self) -> list[str]:
        return [f"  {_text(c)}: skipped, it does not apply ({why})" for c, why in self.skipped]


# what a candidate's build raises when the candidate does not fit the model (PhaseError and
# OutlineError are ValueErrors): any other exception is a fault, and propagates
_DOES_NOT_APPLY = (ValueError, NotImplementedError)


def _fits(planned: Planned, capacity: int) -> str:
    share = 100 * planned.peak / capacity
    return (
        f"peak {fmt_bytes(planned.peak)} of {fmt_bytes(capacity)} per IPU ({share:.0f}%), "
        f"{planned.cycles:,} cycles per step"
    )


def _none_fits(search: _Search, capacity: int, limit: int) -> str:
    changes, best = min(search.tried, key=lambda cp: cp[1].peak)
    lines = [
        f"popxl_fx: memory='auto' found no plan that fits one IPU ({fmt_bytes(capacity)}, "
        f"{MARGIN:.0%} kept free: {fmt_bytes(limit)}). The best, {_text(changes)}, needs "
        f"{fmt_bytes(best.peak)}: short by {fmt_bytes(best.peak - limit)}. Planned:",
        *[f"  {p.describe(c)}" for c, p in search.tried],
        *search.skipped_lines(),
        "Use a smaller model or batch, more replicas with replicated_tensor_sharding, or "
        "Options(device='ipu_model') / 'cpu' to run it anyway.",
    ]
    return "\n".join(lines)
