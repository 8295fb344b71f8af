"""The variables of a `popxl_fx.Module`: one per torch parameter and buffer, and the seed.

Each parameter and buffer the graph uses becomes a variable input named by its torch qualified
name, initialised from the torch tensor (or from the master's, with a working copy cast to the
traced dtype); train-mode random ops split their seeds off one seed variable.
"""

from __future__ import annotations

from typing import Any

import torch

import addons
import popxl_core as popxl
from popxl_core import ops

from .names import unescape
from .variable_data import SEED_NAME, host_data, zeros_for

__all__ = ["ModuleVariables"]


class ModuleVariables(addons.Module):
    """`popxl_fx.Module`'s variables (`build` fills the tables per build)."""

    # torch's grad mode around eager's forward (the pipeline sets it per build): under
    # no_grad only leaves require grad (`requires_grad`)
    grad_enabled = True
    # seeds split off the seed variable by the last build: how far one forward advances it
    # (a phased step's slices start that far apart, `phased_seed`)
    draws = 0
    torch_module: torch.nn.Module
    weightless: bool | frozenset[str]
    working_copies: dict[str, popxl.Tensor]
    # per build: torch tensor id -> variable name, the names' kinds and master tensors, the
    # variables made so far, the seed variable and its last split, the inputs requiring grad
    _canonical: dict[int, str]
    _kinds: dict[str, str]
    _masters: dict[str, torch.Tensor]
    _vars: dict[str, popxl.Tensor]
    _seed: list[popxl.Tensor]
    _grad_inputs: set[int]

    def variable(self, qualname: str) -> popxl.Tensor:
        """The variable of the torch parameter/buffer ``qualname`` (tied tensors share one;
        ``qualname`` is the torch name, or the escaped variable name)."""
        qualname = unescape(qualname)
        value: Any = self.torch_module
        try:
            for part in qualname.split("."):
                value = getattr(value, part)
        except AttributeError:
            raise AttributeError(
                f"{type(self.torch_module).__name__} has no parameter or buffer {qualname!r}."
            ) from None
        return self.variable_for(value)

    def variable_for(self, tensor: torch.Tensor) -> popxl.Tensor:
        name = self._canonical.get(id(tensor))
        if name is None:
            raise KeyError(
                f"the tensor is not a parameter or buffer of {type(self.torch_module).__name__}."
            )
        if name not in self._vars:
            kind, master = self._kinds[name], self._masters.get(name, tensor)
            # a buffer is updated in place (by_ref): it lives in the traced dtype
            data = master.detach() if kind == "param" else master.detach().to(tensor.dtype)
            # overwrite=True: "fc.bias" merges into the "fc" sub-tree that "fc.weight" made
            # (each name is added once: self._vars guards it).
            var = self.add_variable_input(
                name,
                host_data(data, zeros_for(self.weightless, name)),
                popxl.dtype.as_dtype(data.dtype),
                by_ref=kind == "buffer",
                overwrite=True,
            )
            if data.dtype != tensor.dtype:  # a master weight: its working copy, once per graph
                var = self.working_copies[name] = ops.cast(var, popxl.dtype.as_dtype(tensor.dtype))
            self._vars[name] = var
        return self._vars[name]

    def requires_grad(self, t: popxl.Tensor) -> bool:
        """Whether eager's twin of ``t`` requires grad: it is computed from a parameter that
        requires grad. Torch picks some kernels by it (a float attention mask that requires
        grad runs SDPA's math kernel), so a lowering asks to pick the same one. Inputs count
        where `inputs_require_grad` says so; with ``grad_enabled`` False (an inference program
        called under ``torch.no_grad``) only the parameters and inputs themselves."""
        trainable = set(self._grad_inputs) | {
            id(v)
            for n, v in self._vars.items()
            if self._kinds[n] == "param" and self._masters[n].requires_grad
        }
        if not self.grad_enabled:  # eager under no_grad: computed tensors never require grad
            return id(t) in trainable
        seen, stack = set(), [t]
        while stack:
            x = stack.pop()
            if id(x) in trainable:
                return True
            if id(x) in seen or x.producer is None:
                continue
            seen.add(id(x))
            if not x.producer.opdef.stops_gradient:
                stack.extend(x.producer.inputs)
        return False

    def seed(self) -> popxl.Tensor:
        """A fresh seed, split from one seed variable that advances every run."""
        if not self._seed:
            start = int(torch.initial_seed() % (2**31))
            var = self.add_variable_input(
                SEED_NAME, lambda: popxl.create_seeds(start), popxl.uint32, by_ref=True
            )
            self._seed = [var, var]
        fresh, self._seed[1] = ops.split_random_seed(self._seed[1], 2)
        self.draws += 1
        return fresh

    def _advance_seed(self) -> None:
        if self._seed:
            ops.var_updates.copy_var_update_(self._seed[0], self._seed[1])
