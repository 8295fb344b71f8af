"""What a trainer's program depends on in the torch objects: the key each call checks
(`structure_key`) and, when it changed, the change in words (`snapshot`, `describe`).

`structure_key` is what each call checks (cheaply: identities, flags, dtypes, shapes and
storage pointers, no names or values): the modules and their parameters and buffers, the
``requires_grad`` flags, the optimizer's param groups and the options of each group that the
program is built with. A different key selects (or builds) another program, with the reason
logged (`describe`); a storage pointer that moved (``p.data = ...``) re-shares the variable.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from operator import attrgetter

import torch
from torch import nn

from .optim import group_structure

__all__ = [
    "BUFFER_FIELDS",
    "PARAMETER_FIELDS",
    "Structure",
    "describe",
    "modules_of",
    "snapshot",
    "structure_key",
]

# What the key reads of each parameter and buffer besides its identity, device and storage
# pointer. `structure_watch.py` checks the same getters, so a field added here is watched too.
PARAMETER_FIELDS = attrgetter("requires_grad", "dtype", "shape")
BUFFER_FIELDS = attrgetter("dtype", "shape")


# what the program depends on ---------------------------------------------------------------
@dataclass
class Structure:
    """What a program was built for besides its inputs: a flat key of identities, flags,
    dtypes and shapes, the objects behind the identities (kept alive, so an id is never
    reused while the key exists), and the storage pointers of the tensors."""

    key: tuple
    objects: list = field(repr=False)
    pointers: tuple = ()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Structure) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)


def modules_of(model: nn.Module) -> Iterator[nn.Module]:
    """Every module once, depth first in registration order (no names: it runs per step)."""
    seen, stack = set(), [model]
    while stack:
        m = stack.pop()
        if m is None or id(m) in seen:
            continue
        seen.add(id(m))
        yield m
        stack.extend(reversed(m._modules.values()))


def structure_key(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> Structure:
    """The `Structure` of ``model`` and ``optimizer`` now (see the module docstring). It runs
    before every step: one pass over the modules (`modules_of`' order), each tensor's device as
    ``True`` when on the CPU (``is_cpu``: ``.device`` makes an object per call), else its
    device type."""
    key: list = []
    objects: list = []
    pointers: list = []
    for m in modules_of(model):
        key.append(id(m))
        objects.append(m)
        for p in m._parameters.values():
            if p is not None:
                where = p.is_cpu or p.device.type
                key += (id(p), *PARAMETER_FIELDS(p), where)
                objects.append(p)
                pointers.append(p.data_ptr())
        for b in m._buffers.values():
            if b is not None:
                key += (id(b), *BUFFER_FIELDS(b), b.is_cpu or b.device.type)
                objects.append(b)
                pointers.append(b.data_ptr())
    if optimizer is not None:
        kind = type(optimizer)
        for pg in optimizer.param_groups:
            params = pg["params"]
            key.append(len(params))
            key += map(id, params)
            key.append(group_structure(kind, pg))
            objects += params
    return Structure(tuple(key), objects, tuple(pointers))


def describe(old: dict, new: dict) -> str:
    """The changes between two `snapshot`s, in words (for the recompile log and errors)."""
    changes = []
    for what in dict.fromkeys([*old, *new]):
        before, after = old.get(what), new.get(what)
        if before == after:
            continue
        if before is None:
            changes.append(f"{what} was added")
        elif after is None:
            changes.append(f"{what} was removed")
        elif what.startswith("parameter") and before[0] == after[0] and before[1] != after[1]:
            changes.append(f"{what} has requires_grad={after[1]}")
        elif before[0] != after[0] and not what.startswith("optimizer"):
            changes.append(f"{what} was replaced by another object")
        else:
            changes.append(f"{what} changed from {_words(before)} to {_words(after)}")
    return "; ".join(changes[:6]) + ("; ..." if len(changes) > 6 else "")


def _words(entry: tuple) -> str:
    return ", ".join(str(x) for x in (entry[1:] if isinstance(entry[0], int) else entry))


def snapshot(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict:
    """The structure with names (what `describe` compares; only when the key changed)."""
    names: dict[str, tuple] = {}
    for path, m in model.named_modules(remove_duplicate=False):
        names[f"module '{path or '(root)'}'"] = (id(m), type(m).__name__)
    for n, p in model.named_parameters(remove_duplicate=False):
        names[f"parameter '{n}'"] = (id(p), p.requires_grad, p.dtype, tuple(p.shape))
    for n, b in model.named_buffers(remove_duplicate=False):
        names[f"buffer '{n}'"] = (id(b), b.dtype, tuple(b.shape))
    if optimizer is not None:
        by_id = {id(p): n for n, p in model.named_parameters()}
        for i, pg in enumerate(optimizer.param_groups):
            held = tuple(by_id.get(id(p), "a tensor not in the model") for p in pg["params"])
            names[f"optimizer param group {i}"] = (held, group_structure(type(optimizer), pg))
    return names
