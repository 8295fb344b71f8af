"""The one build pipeline behind `training_model`, `inference_model` and `compile`.

Every program popxl_fx builds goes through the same stages, in this order (`STAGES`; the
`Options` field each stage applies in brackets):

    signature      input shapes/dtypes and train/eval modes: the key of `Programs`
    capture        torch.fx trace on the user's first inputs of that signature
    lower          the forward graph (`popxl_fx.Module.create_graph`); the variables are
                   named by torch names                                   [outline]
    backward       autodiff of the forward graph (training and compile)
    recompute      each outlined block's forward rebuilt in its backward  [recompute]
    accumulation   the step calls forward and backward once per micro-batch, gradients
                   mean-accumulated                                       [gradient_accumulation]
    batch_serialisation  each micro-batch in slices                      [batch_serialisation]
    replication    gradients reduced over replicas (+ sharded optimizer state)
                                                 [replication_factor, replicated_tensor_sharding]
    precision      float16 weights and activations, float32 master weights
                                                                      [precision, loss_scaling]
    optimizer      the torch optimizer as var updates (training)
    device_iterations  the whole step repeated n times per call         [device_iterations]
    session        plan, compile, attach (`make_session`)

An entry point asks for what it needs and nothing else: `training_model` the loss, its
backward and the optimizer (`steps.build_training`); `inference_model` the forward only
(`steps.build_inference`); `compile` the forward and the backward graph for its
``autograd.Function`` bridge (`steps.lower_for_compile`, in both of its programs).

Plugging in a transform: each `Options` field has one place, a function of this module or of
`steps` / `loops` that reads the field, changes the graphs it is given and calls
`Build.record(stage, detail)` once it ran (a stage recorded out of `STAGES` order raises, so
the order stays the stated one):

    new_ir             Ir(replication=...)                          [replication_factor]
    lower              one graph per repeated block, bound per call site       [outline]
    backward           then recompute_graph of the block gradients            [recompute]
    steps.shape_of / loops.micro_batch_loop   the step's shape (plain, loops, phases)
                                     [gradient_accumulation, batch_serialisation, device_iterations]
    reduce_gradients   all-reduce / reduce-scatter before the optimizer
                                                 [replication_factor, replicated_tensor_sharding]
    refusals.refuse    the fields an entry point refuses (until it applies them)

(`lower`, `backward` and `accumulating_backward` live in `lower_stage`, re-exported here.)

The records are what `explain` prints: the stages that ran, their graphs with how often
each runs per call, and the memory per IPU after the stage (planned on the program as built
so far, once the step's call sites exist; `Build.planned`). Weights shared with torch are
made in one place, `weights_of`, and copied either way by `program.Weights` (``to_torch`` /
``from_torch`` for the trainer, ``changed_from_torch`` for inference).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from torch import nn

import addons
import popxl_core as popxl
from popxl_core.sim.machine import machine_for
from popxl_core.sim.plan import build_plan

from . import lowerings, replication  # noqa: F401  (lowerings fills the lowering table)
from .calls import POSITIONAL, Binding
from .capture_cache import SharedCaptures, unshared
from .example_values import forget_examples
from .lower_stage import Lowered, accumulating_backward, backward, lower
from .options import Options
from .precision import unscale
from .program import Weights, describe_change, log, make_session
from .program_key import same_key
from .refusals import refuse
from .stage import GraphRow, Stage

__all__ = [
    "STAGES",
    "Build",
    "GraphRow",
    "Lowered",
    "Programs",
    "Stage",
    "accumulating_backward",
    "backward",
    "lower",
    "master_gradients",
    "reduce_gradients",
    "weights_of",
]

STAGES = (
    "capture",
    "lower",
    "backward",
    "recompute",
    "accumulation",
    "batch_serialisation",
    "replication",
    "precision",
    "optimizer",
    "device_iterations",
    "session",
)


class Build:
    """One program under construction: its Ir, options and stage records.

    Args:
        entry: who asks ("training_model", "inference_model", "compile").
        model: the user's torch model (for messages).
        options: resolved `Options`.
        prefix: where the user's model sits in the traced root (the loss wrapper's "model.").
        binding: how the program's inputs reach the traced root's ``forward``
            (`popxl_fx.calls.Binding`: keyword tensors, constants).
    """

    def __init__(
        self,
        entry: str,
        model: nn.Module,
        options: Options,
        prefix: str = "",
        plan_only: bool = False,
        binding: Binding = POSITIONAL,
        weightless: bool = False,
    ) -> None:
        self.entry = entry
        self.binding = binding
        self.plan_only = plan_only  # what-if: weightless variables, a plan and no Session
        # variables made as broadcast zeros, no weight copies: all for what-if plans; the
        # model's parameters and buffers for programs whose owner writes them when the
        # Session attaches (the trainer's `SharedState`), so a model too big for the IPU
        # gets its OOM error before any copy (traced constants keep their data)
        self.weightless: bool | frozenset[str] = plan_only or (
            weightless and frozenset(prefix + n for n, _ in _state(model))
        )
        self.plan: Any = None
        self.notes: list[str] = []  # added to the "session" record (memory="auto"'s choice)
        self.model = model
        self.options = options
        self.prefix = prefix
        self.ir = new_ir(options)
        self.stages: list[Stage] = []
        refuse(entry, options)  # the fields ``entry`` does not apply (yet)
        # torch's grad mode of the eager forward this program stands for (inference_model
        # follows its caller's: torch picks some kernels by what requires grad)
        self.grad_enabled = True
        self.planned = False  # the main graph calls the step: stage records plan memory
        # what holds the capture's example values (the lowered `Module`s, phased pieces):
        # only the build reads them, so they become meta tensors before the Session is made
        self.captures: list[Any] = []
        # captures shared with the other builds of one signature (memory="auto"'s what-if
        # builds and the chosen one, `capture_cache`): their owner forgets them, not the build
        self.shared: SharedCaptures | None = None

    def record(
        self,
        name: str,
        detail: str,
        new_graphs: Iterable[Any] = (),
        plan: Any = None,
        unchanged: bool = False,
    ) -> Stage:
        """Append the record of stage ``name`` (one of `STAGES`, after the last recorded); its
        rows and memory from ``plan`` when given (the Session's), else from a plan of the
        program so far once the main graph calls the step. ``unchanged``: the caller made no
        op or graph since the last record (the two calls follow each other), so the program
        and its plan are that record's: its rows and memory, not a second plan."""
        if name not in STAGES:
            raise ValueError(f"unknown pipeline stage {name!r}; the stages are {STAGES}.")
        if self.stages and STAGES.index(name) <= STAGES.index(self.stages[-1].name):
            raise RuntimeError(
                f"pipeline stage {name!r} recorded after {self.stages[-1].name!r}: the stages "
                f"run in the order {STAGES}."
            )
        made = {_graph_of(g).name: len(_graph_of(g).ops) for g in new_graphs}
        if plan is not None:
            rows, memory = _plan_rows(plan)
        elif unchanged and self.stages:
            rows, memory = self.stages[-1].graphs, dict(self.stages[-1].memory)
        elif self.planned and not self.plan_only:
            rows, memory = self._plan()
        else:  # a what-if build's records are never read: only its last plan is (`plan`)
            rows, memory = (), {}
        stage = Stage(name, detail, made, rows, memory)
        self.stages.append(stage)
        return stage

    def _plan(self) -> tuple[tuple[GraphRow, ...], dict[int, int]]:
        # the simulator's plan of the program so far, on the options' target, never fatal
        # (only the Session's plan decides out-of-memory) and never reported as one; a record
        # keeps no cycles, and a plan estimates them only when read (`Plan`)
        return _plan_rows(build_plan(self.ir, _no_oom(self.options), observe=False))

    def session(self) -> popxl.Session | None:
        """The Session of the built Ir, attached (the weights live on the device between
        calls); its plan is the `session` stage's record. A ``plan_only`` build plans the
        Ir on the options' target (never fatal), keeps it in ``plan`` and returns None."""
        # the graphs are built: no activations kept (the shared ones: by their owner)
        forget_examples(*unshared(self.shared, self.captures))
        if self.plan_only:
            self.plan = build_plan(self.ir, _no_oom(self.options), observe=False)
            return None
        session = make_session(self.ir, self.options, self.prefix, self.model)
        session.__enter__()
        outlined = session.report.outlining()
        saved = f"; {outlined.line()}" if outlined.call_sites else ""
        notes = "".join(f"\n{n}" for n in self.notes)
        # the Session's own plan, not a second plan of the same Ir
        self.record(
            "session", f"Session on {self.options.device!r}{saved}{notes}", plan=session.plan
        )
        return session


def _plan_rows(plan) -> tuple[tuple[GraphRow, ...], dict[int, int]]:
    """A plan's rows per graph and memory per IPU, as a stage records them."""
    rows = tuple(GraphRow(g.name, g.ops, g.code_bytes, g.runs) for g in plan.graphs)
    return rows, {ipu: m.total for ipu, m in plan.memory.items()}


def _state(model: nn.Module):
    yield from model.named_parameters()
    yield from model.named_buffers()


def _no_oom(options: Options):
    """The options' target, planned without an out-of-memory error or warning."""
    return dataclasses.replace(machine_for(options.device), oom_is_error=False, oom_warns=False)


def _graph_of(g: Any) -> popxl.Graph:
    return g.graph if isinstance(g, addons.GraphWithNamedArgs) else g


def new_ir(options: Options) -> popxl.Ir:
    """The Ir of one program: ``options.replication_factor`` replicas."""
    return popxl.Ir(replication=options.replication_factor)


def reduce_gradients(
    build: Build, grads: dict[str, popxl.Tensor], record: bool = True
) -> dict[str, popxl.Tensor]:
    """The gradients the optimizer steps with, by torch parameter name, in the graph that
    runs the optimizer: with replication mean all-reduced over the replicas, or with
    replicated_tensor_sharding reduce-scattered into this replica's shard (the optimizer then
    updates the shard: `optim_replicated`); records the "replication" stage. With one
    replica they are the step's own gradients. ``record=False``: the caller records it
    (the phased step reduces phase by phase and records the stage once)."""
    return replication.reduce_gradients(build, grads, record)


def master_gradients(
    build: Build, grads: dict[str, popxl.Tensor], record: bool = True
) -> dict[str, popxl.Tensor]:
    """The gradients of the scaled loss, divided by ``loss_scaling`` in float32 (float32
    master gradients; a float16 weight's are read into float32 first, as its update is, so
    that what scaling kept from underflowing survives); records the "precision" stage when
    the program is float16 or scales its loss (and ``record``)."""
    opts = build.options
    if opts.precision != "float16" and opts.loss_scaling == 1.0:
        return grads
    if record:
        record_precision(build)
    return {n: unscale(g, opts) for n, g in grads.items()}


def record_precision(build: Build) -> None:
    """The "precision" stage of a float16 program (or of a loss-scaled one)."""
    opts = build.options
    what = (
        "float16 weights (cast from float32 masters) and activations; "
        if opts.precision == "float16"
        else "the model's own dtypes; "
    )
    build.record(
        "precision",
        f"{what}loss scaled by {opts.loss_scaling:g}, gradients unscaled in float32",
    )


def weights_of(variables: Any, lowered: Lowered, prefix: str = "") -> Weights:
    """The bridge between the bound variables and the torch model's tensors (the one place a
    program's weights are tied to torch's)."""
    return Weights.from_named(variables.to_dict(), lowered.torch_names(), prefix)


P = TypeVar("P")


class Programs(Generic[P]):
    """Built programs by signature, and the active one (the last one asked for).

    ``get`` logs why it switches program; ``leave``/``enter`` let the owner move state (the
    trainer's weights go through torch, so every program sees the same ones).
    """

    def __init__(self, entry: str, why: Callable[[Any, Any], str] = describe_change) -> None:
        self.entry = entry
        self.why = why
        self.built: dict[Any, P] = {}
        self.active: P | None = None
        self.active_signature: Any = None

    def __len__(self) -> int:
        return len(self.built)

    def get(
        self,
        signature: Any,
        build: Callable[[], P],
        leave: Callable[[P], None] | None = None,
        enter: Callable[[P], None] | None = None,
    ) -> P:
        if self.active is not None and same_key(self.active_signature, signature):
            return self.active
        if self.active is not None:
            log.info("%s: recompiling, %s", self.entry, self.why(self.active_signature, signature))
            if leave is not None:
                leave(self.active)
        prog = self.built.get(signature)
        if prog is None:
            prog = self.built[signature] = build()
        self.active, self.active_signature = prog, signature
        if enter is not None:
            enter(prog)
        return prog
