"""One source of truth: a trainer's device variables are the torch model's and optimizer's
own tensors, and every torch-side change is seen before the next step.

Shared storage: each parameter and buffer variable of the program *is* the torch tensor
(`popxl_core.Session.share_variable_storage`), and so is each optimizer state variable
(``momentum_buffer``, ``exp_avg``, ``exp_avg_sq``, ``step``) once torch's optimizer holds it
(torch creates its state on the first step; so does the trainer, after it). A step updates
them in place: ``model.fc.weight``, an eager ``model(x)`` or ``optimizer.state`` see the new
values with no copy, and a user's in-place write between steps is what the next step reads.
With replicas the tensor is replica 0's value (the Session copies a write into it to the
other replicas before the next run). A tensor that cannot be shared (another dtype in the
program, an RTS shard, a process of a torch.distributed job) is copied back after each step
and written to the device before a step when its ``_version`` moved (for replicas and sharded
variables: the gathered value is written back on step, and a write is scattered to every
replica).

The key each call checks, and its change in words, are `torch_structure`'s.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

import popxl_core as popxl
from popxl_core.sim.remote_plan import is_remote_variable

from .optim import OptimizerProgram, UnsupportedOptimizerError
from .program import Weights
from .torch_structure import Structure

__all__ = ["SharedState"]


# shared storage ----------------------------------------------------------------------------
@dataclass
class _Copied:
    """A variable that cannot share the torch tensor's storage: copied, version-tracked."""

    variable: popxl.Variable
    tensor: torch.Tensor
    version: int = -1


class SharedState:
    """Ties one program's variables to the torch model's and optimizer's tensors.

    `attach` when the program becomes the active one; `before_step` and `after_step` around
    each run (cheap: identity and version checks).
    """

    def __init__(
        self, session: popxl.Session, weights: Weights, optim: OptimizerProgram | None
    ) -> None:
        self.session = session
        self.weights = weights
        self.optim = optim
        self.replicated = session.ir.replication_factor > 1
        self.copied: list[_Copied] = []
        self.state: dict[popxl.Variable, tuple[torch.Tensor, str, torch.Tensor | None]] = {}
        self.pointers: tuple = ()
        self.versions: list[tuple[torch.Tensor, int]] = []  # torch's shared `step` tensors

    # attaching --------------------------------------------------------------------------
    def attach(self, structure: Structure) -> None:
        """Share (or copy in) every parameter, buffer and optimizer state tensor now."""
        self.copied = []
        shared = {}
        self._take_first_process_values(
            [(n, self.weights.tensors[n].detach()) for n in self.weights.variables]
        )
        for n, v in self.weights.variables.items():
            t = self.weights.tensors[n]
            if self._can_share(v, t):
                shared[v] = t.detach()
            else:
                self.copied.append(_Copied(v, t))
        if shared:
            self.session.share_variable_storage(shared)
        self._write_changed_copies()
        self.pointers = structure.pointers
        if self.optim is not None:
            self.load_optimizer_state()

    def _take_first_process_values(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        """In a torch.distributed job every process starts from rank 0's values, as
        DistributedDataParallel makes them: an unseeded script's processes would otherwise
        train replicas that began from different weights (the program check sees only the
        weightless program)."""
        if not self.replicated:
            return
        changed = self.session.take_first_process_values(tensors)
        if changed:
            more = f" and {len(changed) - 3} more" if changed[3:] else ""
            shown = ", ".join(changed[:3]) + more
            warnings.warn(
                f"popxl_fx: this process's {shown} differed from process rank 0's and now "
                "hold rank 0's values, as DistributedDataParallel does: every replica starts "
                "from the same weights (seed torch the same way in every process to make "
                "them equal from the start).",
                stacklevel=2,
            )

    def _can_share(self, v: popxl.Variable, t: torch.Tensor) -> bool:
        # a remote variable (phased execution) in a buffer of its own is that buffer's storage
        # (one replica; RTS shards over every replica are slices of it); with replicas the
        # Session shares replica 0's value where that is the host value; the rest are copied
        return (
            self.session.storage_shareable(v)
            and t.dtype == v.dtype.as_torch()
            and t.numel() == v.nelms
            and t.is_contiguous()
            and t.device.type == "cpu"
        )

    def load_optimizer_state(self) -> None:
        """Take the torch optimizer's state as it is now: its tensors shared, zeros where it
        has none (torch makes those on the first step; `after_step` hands ours over)."""
        optim = self.optim
        assert optim is not None  # called only for a program with an optimizer
        shared, copies = {}, {}
        self.state = {}
        state_vars = set(optim.variables())
        self.copied = [c for c in self.copied if c.variable not in state_vars]
        self._take_first_process_values(
            [
                (f"{name} optimizer state {key!r}", t)
                for name in optim.state
                for key, t in optim.optimizer.state.get(optim.params[name], {}).items()
                if isinstance(t, torch.Tensor) and key in optim.state[name]
            ]
        )
        for name, vars_ in optim.state.items():
            p = optim.params[name]
            held = optim.optimizer.state.get(p, {})
            for key, var in vars_.items():
                t = held.get(key)
                if t is None:
                    # a broadcast fill (zero, but where the optimizer's kind says): the
                    # Session keeps it unmaterialised until it runs
                    fill = np.full((), optim.initial_fill(name, key), var.dtype.as_numpy())
                    copies[var] = np.broadcast_to(fill, var.shape)
                elif t.dtype != var.dtype.as_torch():
                    raise _state_dtype_error(name, key, t, var)
                elif self._can_share(var, t):
                    shared[var] = t
                else:  # copied in now, back after each step, in again when written
                    self.copied.append(_Copied(var, t))
                self.state[var] = (p, key, t)
        if shared:
            self.session.share_variable_storage(shared)
        if copies:
            self.session.write_variables_data(copies)
        self._write_changed_copies()
        for g in optim.groups:
            g.step = optim._initial_step(g)
        self._note_versions()

    def _note_versions(self) -> None:
        """The versions of torch's ``step`` tensors: if one moves outside our steps (another
        trainer on this optimizer, a user's write), the step counts are read again."""
        self.versions = [
            (t, t._version)
            for (_, key, t) in self.state.values()
            if key == "step" and t is not None
        ]

    # per step ---------------------------------------------------------------------------
    def before_step(self, structure: Structure) -> None:
        """What changed on the torch side since the last step reaches the device."""
        if structure.pointers != self.pointers:  # p.data = ... : share the new storage
            self.attach(structure)
            return
        if self.copied:
            self._write_changed_copies()
        if self.optim is not None:
            self._optimizer_state_changed()

    def _optimizer_state_changed(self) -> None:
        """torch's state replaced (load_state_dict, clear): take it; a ``step`` tensor moved
        by someone else: read the step counts again."""
        optim = self.optim
        assert optim is not None  # `before_step` calls it only then
        state = optim.optimizer.state
        for p, key, t in self.state.values():
            if state.get(p, _EMPTY).get(key) is not t:  # load_state_dict, or state cleared
                self.load_optimizer_state()
                return
        for t, version in self.versions:
            if t._version != version:
                for g in optim.groups:
                    g.step = optim._initial_step(g)
                self._note_versions()
                return

    def after_step(self) -> None:
        """Copies back what is not shared; torch's optimizer gets the state it now has."""
        if self.copied:
            self.weights_to_torch()
        if self.optim is None:
            return
        new = [var for var, (_, _, t) in self.state.items() if t is None]
        if new:
            self._hand_over(new)
        self._note_versions()

    def _hand_over(self, new: list[popxl.Variable]) -> None:
        """The state variables torch has no tensor for yet (first step): make torch's, with
        the device values, in torch's format (``step`` a float32 scalar), and share them."""
        assert self.optim is not None  # `after_step` calls it only then
        shared = {}
        for var in new:
            p, key, _ = self.state[var]
            shape = () if key == "step" else p.shape
            t = self._device_value(var).reshape(shape)
            self.optim.optimizer.state[p][key] = t
            self.state[var] = (p, key, t)
            if self._can_share(var, t):
                shared[var] = t
            else:
                self.copied.append(_Copied(var, t, t._version))
        if shared:
            self.session.share_variable_storage(shared)

    def _device_value(self, var: popxl.Variable) -> torch.Tensor:
        """The variable's device value as a torch tensor of its own: the device tensor itself
        where it can be shared (no copy), else a copy of the host value."""
        if is_remote_variable(var):
            shared = self.session.storage_shareable(var)  # its buffers are views of one tensor
        else:
            shared = not self.replicated
        if shared:
            return self.session.device_tensor(var)
        return torch.from_numpy(np.array(self.session.get_tensor_data(var)))

    def weights_to_torch(self) -> None:
        """The device values of the tensors that are copied, not shared, into torch's: with
        replicas straight from the device tensor the host value is read from (one copy),
        else through the Session's host values (the copies as one multi-tensor call: a model
        of many small weights paid a Python call per weight)."""
        rest, done, dst, src = [], [], [], []
        for c in self.copied:
            t = self.session.read_tensor(c.variable) if self.replicated else None
            if t is None:
                rest.append(c)
                continue
            done.append(c)
            dst.append(c.tensor)
            src.append(t.reshape(c.tensor.shape))
        if dst:
            with torch.no_grad():
                torch._foreach_copy_(dst, src)
            for c in done:
                c.version = c.tensor._version
        if rest:
            self._copy_from_host(rest)

    def _copy_from_host(self, copied: list[_Copied]) -> None:
        values = self.session.get_tensors_data([c.variable for c in copied])
        with torch.no_grad():
            for c in copied:
                value = torch.from_numpy(np.asarray(values[c.variable]))
                c.tensor.copy_(value.reshape(c.tensor.shape))
                c.version = c.tensor._version

    def _write_changed_copies(self) -> None:
        changed = [c for c in self.copied if c.tensor._version != c.version]
        if changed:
            self.session.write_variables_data(
                {
                    c.variable: c.tensor.detach()
                    .cpu()
                    .contiguous()
                    .numpy()
                    .astype(c.variable.dtype.as_numpy())
                    .reshape(c.variable.shape)
                    for c in changed
                }
            )
            for c in changed:
                c.version = c.tensor._version


_EMPTY: dict = {}


def _state_dtype_error(name: str, key: str, t: torch.Tensor, var: popxl.Variable) -> Exception:
    """torch's state in another dtype than its parameter (the model converted after the
    optimizer stepped): eager keeps computing that state in its old dtype, op by op, which
    the program (state in the parameter's dtype) cannot reproduce."""
    return UnsupportedOptimizerError(
        f"the optimizer's {key!r} of parameter '{name}' is {t.dtype}, the parameter "
        f"{var.dtype.as_torch()} (the model's dtype changed after the optimizer stepped); "
        "make a new optimizer (and trainer) for the converted model, or convert before the "
        "first step."
    )
