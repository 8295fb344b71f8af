"""`StructureWatch`: the per-step `torch_structure.structure_key`, answered from the last one.

A trainer checks its model's and optimizer's structure before every step. Building the key
walks every module in Python and makes a ~360-entry tuple for GPT (60 us alone, 130-180 us in a
step, where the walk's objects are no longer in the cache: 4-5 % of the step). The watch keeps,
from the last full walk, the modules in walk order and flat lists of everything the key is
made of (each module's children, parameters and buffers by identity and count; each tensor's
``requires_grad``, dtype, shape, device and storage pointer; the optimizer's param groups and
their built-in options) and checks them with C-level ``map`` passes. If all are the same, the
full walk would give the same key, so the last `Structure` object is returned (and its
identity makes the program cache's comparison instant); if anything differs, the key is
walked again as before. So a change is seen exactly as by `structure_key`.
"""

from __future__ import annotations

from itertools import chain
from operator import attrgetter, is_

import torch
from torch import nn

from .optim import group_structure
from .program_key import same_key
from .torch_structure import BUFFER_FIELDS, PARAMETER_FIELDS, Structure, modules_of, structure_key

__all__ = ["StructureWatch"]

_CHILDREN = attrgetter("_modules")
_PARAMS = attrgetter("_parameters")
_BUFFERS = attrgetter("_buffers")
_TRAINING = attrgetter("training")
_IS_CPU = attrgetter("is_cpu")
_POINTER = torch.Tensor.data_ptr


def _flat(dicts: list) -> list:
    """The values of ``dicts``, in order, as one list (None entries included)."""
    return list(chain.from_iterable(map(dict.values, dicts)))


def _same(got: list, want: list) -> bool:
    """Element by element the same objects (no ``==``: a tensor's compares values)."""
    return len(got) == len(want) and all(map(is_, got, want))


class _Plan:
    """Everything `structure_key` read in its last walk, as flat lists."""

    def __init__(self, model: nn.Module, optimizer, structure: Structure) -> None:
        self.model, self.optimizer, self.structure = model, optimizer, structure
        self.modules = list(modules_of(model))
        self.dicts = [self._layout(get) for get in (_CHILDREN, _PARAMS, _BUFFERS)]
        self.params = [p for p in self.dicts[1][1] if p is not None]
        self.buffers = [b for b in self.dicts[2][1] if b is not None]
        self.tensors = self._tensor_state()
        self.groups = self._group_state()

    def _layout(self, get) -> tuple:
        dicts = list(map(get, self.modules))
        return list(map(len, dicts)), _flat(dicts)

    def _tensor_state(self) -> tuple:
        ps, bs = self.params, self.buffers
        return (
            list(map(PARAMETER_FIELDS, ps)),
            list(map(_POINTER, ps)),
            list(map(BUFFER_FIELDS, bs)),
            list(map(_POINTER, bs)),
        )

    def _group_state(self) -> list:
        if self.optimizer is None:
            return []
        kind = type(self.optimizer)
        return [(pg, list(pg["params"]), group_structure(kind, pg)) for pg in self._pgs()]

    def _pgs(self) -> list:
        return list(self.optimizer.param_groups)

    def on_cpu(self) -> bool:
        return all(map(_IS_CPU, self.params)) and all(map(_IS_CPU, self.buffers))

    def holds(self) -> bool:
        """The model and optimizer read now as they were read when the plan was made."""
        for get, (lens, flat) in zip((_CHILDREN, _PARAMS, _BUFFERS), self.dicts):
            dicts = list(map(get, self.modules))
            if list(map(len, dicts)) != lens or not _same(_flat(dicts), flat):
                return False
        if not self.on_cpu():
            return False
        return same_key(self._tensor_state(), self.tensors) and self._groups_hold()

    def _groups_hold(self) -> bool:
        if self.optimizer is None:
            return True
        pgs = self._pgs()
        if not _same(pgs, [g[0] for g in self.groups]):
            return False
        kind = type(self.optimizer)
        return all(
            _same(pg["params"], params) and same_key(group_structure(kind, pg), options)
            for pg, params, options in self.groups
        )


class StructureWatch:
    """`structure_key(model, optimizer)` for a trainer's steps: the last `Structure` object
    when nothing it depends on changed (checked in full each call), else a new walk."""

    def __init__(self) -> None:
        self._plan: _Plan | None = None
        self._current = False  # the plan matches the last `key` call: `modes` may use it

    def key(self, model: nn.Module, optimizer) -> Structure:
        plan = self._plan
        self._current = (
            plan is not None
            and plan.model is model
            and plan.optimizer is optimizer
            and plan.holds()
        )
        if self._current and plan is not None:  # (current: plan is not None)
            return plan.structure
        structure = structure_key(model, optimizer)
        plan = _Plan(model, optimizer, structure)
        # a tensor off the CPU: its device type is part of the key; walk each time
        self._plan = plan if plan.on_cpu() else None
        self._current = self._plan is not None
        return structure

    def modes(self, model: nn.Module) -> tuple | None:
        """Every module's ``training`` flag in `program._modes`' order, from the modules the
        last `key` call walked or verified (None: not for ``model``; walk them)."""
        plan = self._plan
        if not self._current or plan is None or plan.model is not model:
            return None
        return tuple(map(_TRAINING, plan.modules))
