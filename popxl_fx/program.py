"""Shared pieces of the programs popxl_fx builds: inputs, Sessions, weights between torch and IR.

A `Weights` object is the bridge between a torch model and the variables of one Ir: it knows
which variable holds which parameter/buffer (by torch qualified name) and copies values either
way. Sessions are built through `make_session`, which turns the simulator's out-of-memory error
into one that names the torch tensors and says what would help.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

import popxl_core as popxl
from popxl_core import ops
from popxl_core.printing import format_schedule
from popxl_core.sim.plan import OutOfMemoryError

from .calls import POSITIONAL, Binding
from .explain import Explanation
from .names import unescape
from .options import Options

if TYPE_CHECKING:  # pragma: no cover (built.py imports this module)
    from .built import Program

__all__ = [
    "Inputs",
    "ProgramView",
    "Weights",
    "load_inputs",
    "make_session",
    "log",
    "signature_of",
    "store",
]

log = logging.getLogger("popxl_fx")


def _popxl_dtype(t: torch.Tensor) -> popxl.dtype:
    return popxl.dtype.as_dtype(t.dtype)


@dataclass
class Inputs:
    """Host-to-device streams for a step's torch inputs, and the loaded tensors."""

    streams: list[popxl.HostToDeviceStream]
    tensors: list[popxl.Tensor]
    replicas: int = 1

    def feed(self, values: Sequence[torch.Tensor]) -> dict:
        """The host arrays of ``values``; with replication the batch dimension ``B`` (after a
        leading device-iterations dimension, if any) becomes ``[R, B/R]`` (PopXL's layout:
        replica r gets rows ``r*B/R`` to ``(r+1)*B/R``, in batch order)."""
        # astype: float inputs of a float16 program are rounded on the host (a no-op otherwise)
        feeds = {
            s: _numpy(v).astype(s.dtype.as_numpy(), copy=False)
            for s, v in zip(self.streams, values)
        }
        if self.replicas == 1:
            return feeds
        return {s: _split_batch(a, len(s.shape), self.replicas) for s, a in feeds.items()}


def _split_batch(a: np.ndarray, rank: int, replicas: int) -> np.ndarray:
    lead = a.ndim - rank  # a leading device-iterations dimension
    return a.reshape(*a.shape[:lead], replicas, -1, *a.shape[lead + 1 :])


def load_inputs(values: Sequence[torch.Tensor], names: Sequence[str], replicas: int = 1) -> Inputs:
    """One stream per torch input (shape and dtype of the example; the batch dimension divided
    by ``replicas``), loaded in the main graph."""
    streams, tensors = [], []
    for value, name in zip(values, names):
        shape = tuple(value.shape)
        if replicas > 1:
            shape = (shape[0] // replicas, *shape[1:])
        s = popxl.h2d_stream(shape, _popxl_dtype(value), name)
        streams.append(s)
        tensors.append(ops.host_load(s, name))
    return Inputs(streams, tensors, replicas)


def signature_of(
    model: nn.Module,
    values: Sequence[object],
    binding: Binding = POSITIONAL,
    modes: tuple | None = None,
) -> tuple:
    """What a compiled program is specialised to: input shapes/dtypes, every module's mode
    and how the inputs reach forward (keyword names, constants: `calls.Binding`). ``modes``:
    the modules' modes when the caller has them (`StructureWatch.modes`), else walked here."""
    shapes = tuple(
        (tuple(v.shape), str(v.dtype)) if isinstance(v, torch.Tensor) else repr(v) for v in values
    )
    return shapes, _modes(model) if modes is None else modes, binding.key()


def _modes(model: nn.Module) -> tuple:
    """``tuple(m.training for m in model.modules())``, walked without `named_modules`'
    generators and prefix strings (it runs before every step: a third of the time for GPT's
    41 modules). Same order: depth first, children in registration order, each module once."""
    modes, seen, stack = [], set(), [model]
    while stack:
        m = stack.pop()
        if m is None or m in seen:
            continue
        seen.add(m)
        modes.append(m.training)
        stack.extend(reversed(m._modules.values()))
    return tuple(modes)


def describe_change(old: tuple, new: tuple) -> str:
    """Why a signature differs from the previous one, in words (for the recompile log)."""
    if old[1] != new[1]:
        return "the model's train/eval mode changed"
    if old[3:] != new[3:]:  # inference_model's: eager's grad mode picks some kernels
        return f"torch's grad mode changed (enabled: {new[3]})"
    if old[0] == new[0] and old[2:] != new[2:]:
        return f"the keyword arguments changed from {old[2]} to {new[2]}"
    return f"the inputs changed from {old[0]} to {new[0]}"


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().contiguous().numpy()


def _versions(tensors: Mapping[str, torch.Tensor]) -> dict[str, tuple[int, int]]:
    """Identity and in-place version of each tensor: what changes when torch updates it."""
    return {n: (id(t), t._version) for n, t in tensors.items()}


@dataclass
class Weights:
    """Variables of one Ir by torch name (``prefix`` stripped), and their torch tensors."""

    variables: dict[str, popxl.Variable]
    tensors: dict[str, torch.Tensor]
    kinds: dict[str, str] = field(default_factory=dict)  # name -> "param" | "buffer"
    # torch tensor identity and in-place version when last equal to the device's values
    synced: dict[str, tuple[int, int]] = field(default_factory=dict)

    @classmethod
    def from_named(
        cls, named: Mapping[str, popxl.Variable], torch_names: Mapping[str, tuple], prefix: str = ""
    ) -> Weights:
        variables, tensors, kinds = {}, {}, {}
        for name, var in named.items():
            if name not in torch_names:
                continue  # e.g. the random seed: state of the program, not of the model
            short = name[len(prefix) :] if name.startswith(prefix) else name
            kinds[short], tensors[short] = torch_names[name]
            variables[short] = var
        return cls(variables, tensors, kinds)

    def names(self, kind: str) -> list[str]:
        return [n for n, k in self.kinds.items() if k == kind]

    def to_torch(self, session: popxl.Session, kinds: Sequence[str] = ("param", "buffer")) -> None:
        """Copy the device values of these variables into the torch tensors, in place."""
        names = [n for n in self.variables if self.kinds[n] in kinds]
        values = session.get_tensors_data([self.variables[n] for n in names])
        with torch.no_grad():
            for n in names:
                t = self.tensors[n]
                t.copy_(torch.from_numpy(np.asarray(values[self.variables[n]])).reshape(t.shape))

    def from_torch(
        self, session: popxl.Session, kinds: Sequence[str] = ("param", "buffer")
    ) -> None:
        """Write the torch tensors' values into the device variables."""
        session.write_variables_data(
            {
                v: _host_value(self.tensors[n], v)
                for n, v in self.variables.items()
                if self.kinds[n] in kinds
            }
        )

    # only what torch changed ---------------------------------------------------------
    def changed_from_torch(self, session: popxl.Session) -> None:
        """Write the torch tensors changed (replaced or updated in place) since the last
        `mark_synced` into the device variables; all of them after `forget_synced`."""
        now = _versions(self.tensors)
        changed = [n for n, v in now.items() if self.synced.get(n) != v]
        if changed:
            session.write_variables_data(
                {
                    self.variables[n]: _host_value(self.tensors[n], self.variables[n])
                    for n in changed
                }
            )
        self.synced = now

    def mark_synced(self) -> None:
        """The device and the torch tensors hold the same values now."""
        self.synced = _versions(self.tensors)

    def forget_synced(self) -> None:
        self.synced = {}


def _host_value(tensor: torch.Tensor, var: popxl.Variable) -> np.ndarray:
    # astype: a float16 program keeps buffers in float16 (the torch model's stay float32);
    # a no-op otherwise
    return _numpy(tensor).astype(var.dtype.as_numpy(), copy=False)


def make_session(
    ir: popxl.Ir, options: Options, prefix: str = "", model: nn.Module | None = None
) -> popxl.Session:
    """A Session on ``options.device``; an IPU overflow names the largest torch tensors.

    The Ir runs torch's own kernels (``numerics="torch"``): popxl_fx's reference is eager
    PyTorch, bit for bit, where hand-written PopXL gets the IPU's batch-size-independent
    matmul (`popxl_core.Ir.numerics`).
    """
    ir.numerics = options.numerics  # "torch" unless Options(numerics="ipu")
    if options.partials_type:  # convs without their own type (popxl_core.ops._conv_partials)
        ir.conv_partials_type = options.partials_type
    try:
        compiler = options.compiler
        if options.kernels == "inductor":  # the opt-in fast mode (popxl_core/sim/inductor.py)
            compiler = dataclasses.replace(compiler, inductor=True)
        session = popxl.Session(ir, options.device, compile_options=compiler)
    except OutOfMemoryError as e:
        if model is None:
            raise OutOfMemoryError(_oom_message(e, prefix), e.plan) from e
        raise OutOfMemoryError(_model_oom_message(e, options, prefix, model), e.plan) from e
    if session.plan.out_of_memory:
        log.warning(
            "the program does not fit one IPU (device=%r runs it anyway):\n%s",
            options.device,
            session.report.summary(),
        )
    return session


def _oom_message(err: OutOfMemoryError, prefix: str) -> str:
    plan = err.plan
    ipu = plan.out_of_memory[0]
    top = sorted(plan.memory[ipu].top, key=lambda row: -row[2])[:5]
    names = ", ".join(f"{_torch_name(n, prefix)} ({b / 2**20:.1f} MiB)" for _, n, b in top)
    return (
        f"popxl_fx: the model does not fit one IPU with device='ipu_hw'. Largest tensors: "
        f"{names}.\nUse popxl_fx.Options(device='ipu_model') to run it anyway (with a "
        "warning), Options(device='cpu') to ignore IPU limits, or a smaller batch or model "
        "(the memory-transform options will come in Options).\n"
        f"Simulator estimate: {err}"
    )


def _model_oom_message(err, options: Options, prefix: str, model: nn.Module) -> str:
    """The per-module table and ranked Options (`popxl_fx.oom`)."""
    from .oom import oom_message, repeated_blocks

    names = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
    return oom_message(err, options, prefix, names, repeated_blocks(model))


def _torch_name(name: str, prefix: str) -> str:
    # variable names escape torch names such as "block1-0" (popxl_fx.names): show torch's
    return unescape(name[len(prefix) :] if prefix and name.startswith(prefix) else name)


def store(t: popxl.Tensor, name: str) -> popxl.DeviceToHostStream:
    """Stream ``t`` to the host through a new device-to-host stream called ``name``."""
    stream = popxl.d2h_stream(t.shape, t.dtype, name)
    ops.host_store(stream, t)
    return stream


class ProgramView:
    """What a trainer or inference model shows of its current program: Ir, Session, report and
    schedules. The owner gives ``_active`` (None until its first call) and names the graphs."""

    @property
    def _active(self) -> Program | None:  # the owner's current program
        return None

    _not_called = "it has not been called yet: call it once first."
    _per = "call"
    _entry = "program"

    def _require(self):
        if self._active is None:
            raise RuntimeError(f"{type(self).__name__}: {self._not_called}")
        return self._active

    def _schedule_graphs(self, prog) -> dict:
        """Graph name -> addons graph whose schedule `print_schedule` shows after main's."""
        return {"forward": prog.forward}

    @property
    def ir(self) -> popxl.Ir:
        """The PopXL Ir of the current program."""
        return self._require().ir

    @property
    def session(self) -> popxl.Session:
        return self._require().session

    def report(self):
        """The Session's `SimReport` (memory per IPU and time per call or step, estimated)."""
        return self._require().session.report

    def print_schedule(self) -> str:
        """The schedules of the main graph and of the graphs it calls."""
        prog = self._require()
        parts = ["main:\n" + format_schedule(prog.ir.main_graph)]
        parts += [
            f"{name}:\n" + g.print_schedule() for name, g in self._schedule_graphs(prog).items()
        ]
        return "\n\n".join(parts)

    def explain(self):
        """The build pipeline as it ran for the current program (`popxl_fx.explain`)."""
        prog = self._require()
        title = f"{self._entry}({type(self._model).__name__})"
        return Explanation(title, self.options, {"step": prog.stages})
