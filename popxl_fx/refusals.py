"""The option combinations popxl_fx refuses: one table of (where, condition, message) rows.

Every refusal is an error, never a silently ignored field. A row applies at one or more
check points (`WHERE`), each checked by one call of `refuse`:

    options          when an `Options` is made (fields that contradict each other)
    training_model / inference_model / compile
                     when an entry point builds a program (fields it does not apply yet)
    phased           when a phased training step is built (fields phasing does not combine
                     with yet)

Rows are checked in table order, so the first refusal that applies is the one raised. Whoever
implements a combination removes its row (and tests it against the plain program).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["AUTO_CHOOSES", "REFUSALS", "WHERE", "Refusal", "refuse"]

ENTRIES = ("training_model", "inference_model", "compile")
WHERE = ("options", *ENTRIES, "phased")

# what memory="auto" chooses itself, and the value that leaves each to it
AUTO_CHOOSES = {
    "phased_execution": False,
    "outline": False,
    "recompute": False,
    "gradient_accumulation": 1,
    "replicated_tensor_sharding": False,
}


@dataclass(frozen=True)
class Refusal:
    """One refused combination: where it is checked, when it applies, what it says."""

    where: tuple[str, ...]  # check points of `WHERE`
    applies: Callable[[Any], bool]  # of the `Options`
    message: Callable[[Any], str]  # of the `Options`: what is refused, and the fix
    error: type[Exception] = ValueError


def refuse(where: str, options: Any) -> None:
    """Raise the first row of `REFUSALS` checked at ``where`` that applies to ``options``."""
    if where not in WHERE:
        raise ValueError(f"unknown refusal check point {where!r}; they are {WHERE}.")
    for row in REFUSALS:
        if where in row.where and row.applies(options):
            raise row.error(row.message(options))


def _changed(options: Any, name: str) -> bool:
    """``name`` is set to other than its default (`Options()`'s)."""
    return getattr(options, name) != getattr(type(options)(), name)


def _unapplied(entry: str, name: str, why: str) -> Refusal:
    """``entry`` does not apply field ``name`` (yet): any value but the default is refused."""
    return Refusal(
        (entry,),
        lambda o: _changed(o, name),
        lambda o: f"Options({name}={getattr(o, name)!r}) {why}; {entry} refuses it.",
    )


def _switched_on(value: object) -> bool:
    return value is True or value not in (False, 1)  # True == 1: a switch is on


def _not_phased_with(name: str) -> Refusal:
    """Phased execution does not combine with ``name`` switched on (yet)."""
    return Refusal(
        ("phased",),
        lambda o: _switched_on(getattr(o, name)),
        lambda o: (
            f"Options(phased_execution={o.phased_execution!r}) does not combine with "
            f"{name}={getattr(o, name)!r} yet; leave {name} at its default."
        ),
    )


def _auto_chooses(name: str, free: object) -> Refusal:
    """memory='auto' chooses ``name`` itself: a value other than ``free`` is refused."""
    return Refusal(
        ("options",),
        lambda o: o.memory == "auto" and getattr(o, name) != free,
        lambda o: (
            f"Options(memory='auto') chooses {name} itself; remove {name}="
            f"{getattr(o, name)!r} (or memory='auto' to choose it by hand)."
        ),
    )


_OPTIONS = (
    Refusal(
        ("options",),
        lambda o: o.replicated_tensor_sharding and o.replication_factor < 2,
        lambda o: (
            "Options(replicated_tensor_sharding=True) shards over replicas: set "
            "replication_factor to 2 or more."
        ),
    ),
    Refusal(
        ("options",),
        lambda o: o.recompute and o.outline is False,
        lambda o: (
            "Options(recompute=True) recomputes outlined blocks: set outline='auto' (or a "
            "list of modules) too."
        ),
    ),
    Refusal(
        ("options",),
        lambda o: o.memory == "auto" and o.device == "cpu",
        lambda o: (
            "Options(memory='auto') plans for an IPU's memory, and device='cpu' has no limit; "
            "use device='ipu_hw' (or 'ipu_model'), or leave memory unset."
        ),
    ),
    *(_auto_chooses(name, free) for name, free in AUTO_CHOOSES.items()),
)

_INFERENCE = (
    _unapplied(
        "inference_model", "gradient_accumulation", "accumulates gradients; inference has none"
    ),
    _unapplied(
        "inference_model",
        "replicated_tensor_sharding",
        "shards optimizer state, and inference has none; leave it False (replication_factor "
        "alone splits the batch over replicas)",
    ),
    _unapplied(
        "inference_model",
        "phased_execution",
        "is built for training steps (forward, backward and optimizer phase by phase); "
        "inference_model does not phase yet: use device='cpu' or 'ipu_model' for a model "
        "bigger than one IPU",
    ),
    _unapplied(
        "inference_model",
        "memory",
        "plans training programs (memory='auto'); inference_model does not plan yet: use "
        "device='cpu' or 'ipu_model' for a model bigger than one IPU",
    ),
    _unapplied(
        "inference_model", "batch_serialisation", "is applied by training_model only so far"
    ),
)

_COMPILE = tuple(
    _unapplied("compile", name, why)
    for name, why in (
        ("batch_serialisation", "is applied by training_model only so far"),
        (
            "precision",
            "is applied by training_model only so far (the torch optimizer steps the float32 "
            "parameters either way)",
        ),
        (
            "gradient_accumulation",
            "is the torch loop's to do around a compiled module (call it per micro-batch, "
            "then optimizer.step())",
        ),
        (
            "device_iterations",
            "is not applied to compile (the torch loop calls it per step); use training_model",
        ),
        (
            "replication_factor",
            "keeps no replicas in step: compile hands the gradients to a torch optimizer "
            "outside the program; use training_model for data-parallel training",
        ),
        (
            "replicated_tensor_sharding",
            "has no optimizer state to shard (compile keeps the optimizer in torch); use "
            "training_model",
        ),
        (
            "phased_execution",
            "runs the optimizer per phase, and compile keeps the optimizer in torch; use "
            "training_model",
        ),
        ("narrow_64bit", "is applied by training_model and inference_model only so far"),
        (
            "loss_scaling",
            "scales the loss of training_model's backward; compile's backward is torch's "
            "autograd (scale the loss before .backward() there)",
        ),
        ("memory", "plans training programs (memory='auto'); use training_model"),
    )
)

_EVERY_ENTRY = (
    # an outlined block's call sites bind the traced (float16) copy's tensors, not the
    # float32 masters: not combined until that is built and tested
    Refusal(
        ENTRIES,
        lambda o: o.outline is not False and o.precision != "float32",
        lambda o: (
            f"Options(outline={o.outline!r}) with precision={o.precision!r} is not applied "
            "yet; use one of them (outline=False, or precision='float32')."
        ),
    ),
)

_PHASED = (
    Refusal(
        ("phased",),
        lambda o: o.precision != "float32",
        lambda o: (
            f"Options(phased_execution={o.phased_execution!r}) does not combine with "
            f"precision={o.precision!r} yet; leave precision at 'float32'."
        ),
    ),
    *(_not_phased_with(name) for name in ("outline", "device_iterations", "narrow_64bit")),
)

REFUSALS: tuple[Refusal, ...] = (*_OPTIONS, *_INFERENCE, *_COMPILE, *_EVERY_ENTRY, *_PHASED)
