"""`training_model`: forward, loss, autodiff and a torch optimizer as one PopXL program.

One Ir and one Session are built per signature (input shapes and dtypes, train/eval modes,
and the `torch_structure.structure_key` of the model and optimizer: parameters, buffers,
requires_grad flags, submodules, param groups and their built-in options) and cached. The
torch model and optimizer are the one source of truth: the program's variables are their
tensors (`torch_state.SharedState`), so after each step ``model.fc.weight``,
``optimizer.state`` and an eager ``model(x)`` hold the trained values, and what the user
writes or loads between steps is what the next step uses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from popxl_core.ops import RuntimeCheckError

from .auto import Choice, Planned, choose
from .calls import POSITIONAL, Binding, bind
from .capture_cache import SharedCaptures
from .checks import check_no_autocast, check_step_arity
from .guards import raise_model_error
from .loss import PREFIX, user_terms, with_loss
from .names import escape
from .optim import OptimizerProgram, UnsupportedOptimizerError
from .options import Options, resolve
from .phase_report import PhasedReport
from .pipeline import Build, Programs
from .program import ProgramView, describe_change, log, signature_of
from .replication import replication_of, unreplicated
from .step_repeat import RepeatStep, hyper_feeds
from .steps import Program, TrainingRequest, build_training
from .structure_watch import StructureWatch
from .torch_state import SharedState
from .torch_structure import Structure, describe, snapshot

__all__ = ["StepLoss", "Trainer", "training_model"]


class Trainer(ProgramView):
    """The callable `training_model` returns: ``trainer(*inputs[, target])`` runs one step."""

    _not_called = "the trainer has not been called yet: run one step first."
    _entry = "training_model"

    def _schedule_graphs(self, prog) -> dict:
        return {"forward": prog.forward, "backward": prog.backward}

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable | None,
        options: Options | None,
        record: bool = False,
        outputs: bool = False,
        untrained_ok: bool = False,
    ) -> None:
        self._model = model
        self._record = record  # also fetch forward outputs and gradients (for testing)
        self._outputs = outputs  # also fetch the forward's other outputs (one step per call)
        self._untrained_ok = untrained_ok  # a loss no trainable parameter reaches runs
        self.last: dict[str, torch.Tensor] = {}
        self.per_replica: dict = {}  # the last step's outputs as the device wrote them
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.given = resolve(options)  # as the user gave them (memory="auto" stays "auto")
        self.choice: Choice | None = None  # memory="auto": its choice, on the first signature
        self._prefix = PREFIX if loss_fn is not None else ""
        OptimizerProgram(optimizer, _names(model))  # reject unsupported optimizers now
        self._programs: Programs[Program] = Programs("training_model", self._why)
        self._snapshot: dict = {}  # the named structure of the active program (for messages)
        self._watch = StructureWatch()  # the structure key, re-walked only when it changed
        self._repeat: RepeatStep | None = None  # the steps that repeat the last one's program

    @property
    def options(self) -> Options:
        """The options the programs are built with: memory='auto''s choice once it is made,
        else the options as given."""
        return self.given if self.choice is None else self.choice.options

    @property
    def memory_plan(self) -> str:
        """memory='auto': the plan chosen and the candidates planned ("" until chosen)."""
        return "" if self.choice is None else self.choice.text

    # the step ------------------------------------------------------------------------
    def __call__(self, *inputs: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """One training step on ``inputs`` (with the target last when there is a loss_fn);
        keyword arguments go to the model's forward (``labels=``, ``attention_mask=``,
        ``use_cache=False``: `popxl_fx.calls.bind`). Returns the loss as a torch scalar.
        Data that fails one of the model's checks (``if bad: raise``) raises the model's
        own error (`popxl_fx.guards`), before anything is updated."""
        try:
            return self._step(*inputs, **kwargs)
        except RuntimeCheckError as failed:
            raise_model_error(self._eager_loss(inputs, kwargs), self._model, failed)

    def _eager_loss(self, inputs: tuple, kwargs: dict) -> Callable[[], Any]:
        loss_fn = self.loss_fn
        if loss_fn is None:
            return lambda: self._model(*inputs, **kwargs)
        return lambda: loss_fn(self._model(*inputs[:-1], **kwargs), inputs[-1])

    def _step(self, *inputs: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        check_no_autocast("the trainer")
        structure = self._watch.key(self._model, self.optimizer)
        modes = self._watch.modes(self._model)
        repeat = self._repeat
        if (
            repeat is not None
            and not kwargs
            and repeat.holds(inputs, structure, modes, self._active)
        ):
            prog = repeat.prog
            shared = _shared(prog)
            shared.before_step(structure)  # writes and loads since the last step reach the device
            out = repeat.run(inputs)
        else:
            inputs, binding = self._bind(inputs, kwargs)
            prog = self._program(inputs, structure, binding)
            shared = _shared(prog)
            shared.before_step(structure)
            out = self._run_full(prog, inputs, kwargs, structure, modes)
        shared.after_step()
        # the optimizer has stepped (on the device): torch's lr schedulers check this flag
        self.optimizer._opt_called = True
        # the run's values as the device wrote them: per replica ([R, ...]), per iteration
        # ([n, ...]) and, for "micro.*", per micro-batch ([k, ...]), in that order
        self.per_replica = {k: out[s] for k, s in prog.outputs.items()}
        # with replication: the loss as the mean over replicas, outputs in batch order
        outputs = {k: s for k, s in prog.outputs.items() if not k.startswith("micro.")}
        values = unreplicated(outputs, out, inputs, self.options)
        self.last = {k: v for k, v in values.items() if k != "loss"}
        return values["loss"].as_subclass(StepLoss)

    def _run_full(self, prog: Program, inputs: tuple, kwargs: dict, structure, modes) -> dict:
        """The step's run through `Session.run` (its checks of every array); the steps after
        it that repeat it go through a `RepeatStep`."""
        hyper = hyper_feeds(prog, self.options)
        assert prog.session is not None  # only a plan-only build has none, and it never runs
        out = prog.session.run({**prog.inputs.feed(inputs), **hyper})
        self._repeat = RepeatStep.after(prog, inputs, kwargs, structure, modes, hyper, self.options)
        return out

    def report(self):
        """The Session's `SimReport`; for a phased program a `PhasedReport` (per phase: peak,
        loaded weights and state, Streaming Memory traffic, cycles and transfer share)."""
        prog = self._require()
        steps = prog.extra.phases
        return prog.session.report if steps is None else PhasedReport(prog.session.report, steps)

    # programs ------------------------------------------------------------------------
    def build(self, *inputs: torch.Tensor, **kwargs: Any) -> Program:
        """Build (or fetch from the cache) the program for ``inputs`` without running a step:
        trace, lower, autodiff, optimizer and Session, as the first call would."""
        inputs, binding = self._bind(inputs, kwargs)
        return self._program(inputs, self._watch.key(self._model, self.optimizer), binding)

    def _bind(self, inputs: tuple, kwargs: dict) -> tuple[tuple, Binding]:
        """The step's flat tensors (keyword tensors after the positional model inputs, the
        target last) and how the model's reach its forward."""
        if self.loss_fn is None or not inputs:
            return bind(inputs, kwargs)
        flat, binding = bind(inputs[:-1], kwargs)
        return (*flat, inputs[-1]), binding

    @property
    def _active(self) -> Program | None:
        return self._programs.active

    def _program(
        self, inputs: tuple, structure: Structure, binding: Binding = POSITIONAL
    ) -> Program:
        modes = self._watch.modes(self._model)  # verified by the `key` call just made
        sig = (signature_of(self._model, inputs, binding, modes), structure)
        build = lambda: self._build(sig, inputs, binding)
        enter = lambda prog: self._activate(prog, structure)
        return self._programs.get(sig, build, None, enter)

    def _activate(self, prog: Program, structure: Structure) -> None:
        """The program becomes the active one: its variables become the torch tensors."""
        _shared(prog).attach(structure)
        self._snapshot = snapshot(self._model, self.optimizer)

    def _why(self, old: tuple, new: tuple) -> str:
        reasons = [describe_change(old[0], new[0])] if old[0] != new[0] else []
        if old[1] != new[1]:
            reasons.append(describe(self._snapshot, snapshot(self._model, self.optimizer)))
        return "; ".join(reasons)

    def _build(self, sig: tuple, inputs: tuple, binding: Binding) -> Program:
        n_keywords = len(binding.keywords)
        check_step_arity(self._model, inputs, self.loss_fn, n_keywords)
        notes = []
        root = self._root(inputs, binding)  # one traced root: the builds share its captures
        shared = None
        if self.choice is None and self.given.memory == "auto":  # chosen once
            shared = SharedCaptures()  # every what-if build and the chosen one capture once
            self.choice = self._choose(sig, inputs, binding, shared, root)
            notes.append(self.choice.text)
        # weightless: `SharedState.attach` shares or writes every parameter and buffer
        build = self._new_build(self.options, binding, weightless=True, shared=shared)
        build.notes += notes
        prog = build_training(build, sig, self._request(inputs, self.options, binding, root))
        if shared is not None:  # built: the shared captures' example values are not needed
            shared.forget()
        assert prog.session is not None  # (not a plan-only build)
        prog.extra.shared = SharedState(prog.session, prog.weights, prog.optim)
        return prog

    def _choose(
        self, sig: tuple, inputs: tuple, binding: Binding, shared: SharedCaptures, root
    ) -> Choice:
        """memory='auto''s choice of options for the program of ``sig`` (what-if plans, all
        of one traced ``root``, sharing their captures: `capture_cache`)."""
        plan = lambda options: self._what_if(sig, inputs, options, binding, shared, root)
        batch = inputs[0].shape[self.given.device_iterations > 1] if inputs else None
        choice = choose(self._model, self.given, plan, batch)
        log.info("%s", choice.text)
        return choice

    def _new_build(
        self,
        options: Options,
        binding: Binding,
        plan_only: bool = False,
        weightless: bool = False,
        shared: SharedCaptures | None = None,
    ) -> Build:
        # with a loss_fn the traced root is the loss wrapper: it binds the model's inputs
        root_binding = POSITIONAL if self.loss_fn is not None else binding
        build = Build(
            "training_model",
            self._model,
            options,
            self._prefix,
            plan_only,
            root_binding,
            weightless=weightless,
        )
        build.shared = shared
        return build

    def _what_if(
        self,
        sig: tuple,
        inputs: tuple,
        options: Options,
        binding: Binding = POSITIONAL,
        shared: SharedCaptures | None = None,
        root: nn.Module | None = None,
    ) -> Planned:
        """Plan the training program under ``options`` without copying weights or making a
        Session (`auto.choose`'s candidates, sharing ``shared``'s captures of ``root``)."""
        root = self._root(inputs, binding) if root is None else root
        build = self._new_build(options, binding, plan_only=True, shared=shared)
        build_training(build, sig, self._request(inputs, options, binding, root))
        peak = max(m.total for m in build.plan.memory.values())
        return Planned(options, peak, build.plan.cycles)

    def _root(self, inputs: tuple, binding: Binding) -> nn.Module:
        """The traced root: the model, or with a loss_fn the loss wrapper that binds the
        model's inputs and the target."""
        if self.loss_fn is None:
            return self._model
        return with_loss(self._model, self.loss_fn, len(inputs) - 1, self._record, binding)

    def _request(
        self, inputs: tuple, options: Options, binding: Binding, root: nn.Module
    ) -> TrainingRequest:
        has_loss_fn = self.loss_fn is not None
        names = [f"input{i}" for i in range(len(inputs))]
        if has_loss_fn:
            names[-1] = "target"
        return TrainingRequest(
            model=self._model,
            root=root,
            inputs=tuple(inputs),
            names=names,
            optimizer=self._optimizer_program(options),
            has_loss_fn=has_loss_fn,
            record=self._record,
            contexts=(lambda: user_terms(self._model, self._prefix),),
            outputs=self._outputs,
            untrained_ok=self._untrained_ok,
        )

    def _optimizer_program(self, options: Options) -> OptimizerProgram:
        try:
            return OptimizerProgram(self.optimizer, _names(self._model), replication_of(options))
        except UnsupportedOptimizerError as e:
            if self._active is None:
                raise
            change = describe(self._snapshot, snapshot(self._model, self.optimizer))
            raise UnsupportedOptimizerError(
                f"since the last step, {change}; the trainer cannot give eager's result: {e} "
                "(a replaced submodule needs its new parameters in the optimizer: build a new "
                "optimizer and trainer)."
            ) from None

    # torch side ----------------------------------------------------------------------
    def copy_weights_to_host(self) -> None:
        """Nothing left to do: the torch model and optimizer hold the trained values after
        every step (kept for code written before they were shared)."""

    @property
    def model(self) -> nn.Module:
        """The torch model (it holds the trained weights)."""
        return self._model


def _names(model: nn.Module) -> dict:
    # variable names: torch names, escaped where PopXL needs it (popxl_fx.names)
    return {p: escape(n) for n, p in model.named_parameters()}


class StepLoss(torch.Tensor):
    """The loss a trainer step returns: a plain tensor whose ``backward`` says why it has no
    graph (the step already ran the backward and the optimizer on the device)."""

    __torch_function__ = torch._C._disabled_torch_function_impl  # ops give plain tensors

    def __repr__(self, **kwargs) -> str:
        return repr(self.as_subclass(torch.Tensor))  # prints as tensor(...), like eager's

    def backward(self, *args, **kwargs):
        raise RuntimeError(
            "this loss was returned by a popxl_fx trainer, whose step already ran the backward "
            "pass and the optimizer step on the simulated IPU: drop loss.backward() and "
            "optimizer.step() from the loop (use loss.item() to log it)."
        )


def _check_arguments(optimizer: object, loss_fn: object, options: object) -> None:
    """The positional slots of `training_model`, said plainly when mixed up."""
    if isinstance(optimizer, Options) or isinstance(loss_fn, Options):
        where = "optimizer" if isinstance(optimizer, Options) else "loss_fn"
        raise TypeError(
            f"training_model got an Options where {where} goes; the signature is "
            "training_model(model, optimizer, loss_fn=None, options=None): pass "
            "options=Options(...) by keyword."
        )
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"training_model's optimizer is a {type(optimizer).__name__}; pass a torch.optim "
            "optimizer over the model's parameters (SGD, Adam or AdamW)."
        )
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError(
            f"loss_fn is a {type(loss_fn).__name__}, not callable; pass a loss such as "
            "torch.nn.functional.cross_entropy or nn.MSELoss(), or None when forward returns "
            "the loss."
        )
    if options is not None and not isinstance(options, Options):
        raise TypeError(f"options is a {type(options).__name__}; pass popxl_fx.Options(...).")


def training_model(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable | None = None,
    options: Options | None = None,
) -> Trainer:
    """A trainer that runs ``model``'s training step, with ``optimizer``, on the simulated IPU.

    Args:
        model: the torch model; its parameters and buffers are the program's weights (shared
            storage: they hold the trained values after each step, and what is written into
            them between steps is what the next step uses).
        optimizer: a ``torch.optim.SGD``, ``Adam`` or ``AdamW`` over ``model``'s parameters
            (``fused=True`` runs torch's fused kernels); its hyper-parameters are read before
            every step (lr schedulers work), and its state tensors are the program's (torch
            gets them on the first step; ``load_state_dict`` between steps is used).
        loss_fn: ``loss_fn(model(*inputs), target)``; without it ``model.forward`` must
            return the loss (or a tuple starting with it, or a dict with ``"loss"``).
        options: `Options` (device, ...).

    Example:
        >>> trainer = training_model(model, torch.optim.SGD(model.parameters(), lr=0.1),
        ...                          torch.nn.functional.cross_entropy)  # doctest: +SKIP
        >>> loss = trainer(images, labels)  # doctest: +SKIP
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"training_model expects a torch.nn.Module, got {type(model).__name__}.")
    _check_arguments(optimizer, loss_fn, options)
    return Trainer(model, optimizer, loss_fn, resolve(options))


def _shared(prog: Program) -> SharedState:
    """The program's `SharedState` (every trainer program has one: `Trainer._program`)."""
    shared = prog.extra.shared
    assert shared is not None
    return shared
