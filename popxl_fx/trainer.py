"""`training_model`: forward, loss, autodiff and a torch optimizer as one PopXL program.

One Ir and one Session are built per input signature (shapes, dtypes, train/eval mode) and
cached; switching signature goes through the torch model (device -> torch -> device), so every
program sees the same weights and optimizer state. The torch model and optimizer stay the
user's: `Trainer.copy_weights_to_host` (run automatically by ``model.state_dict()``,
``optimizer.state_dict()`` and `Trainer.model`) writes the simulated weights and optimizer state
into them in torch's own format.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .auto import Planned, choose
from .loss import PREFIX, user_terms, with_loss
from .optim import OptimizerProgram
from .options import Options, resolve
from .pipeline import Build, Programs
from .program import ProgramView, log, signature_of
from .replication import broadcast_feeds, replication_of, unreplicated
from .steps import Program, TrainingRequest, build_training

__all__ = ["Trainer", "training_model"]


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
    ) -> None:
        self._model = model
        self._record = record  # also fetch forward outputs and gradients (for testing)
        self.last: dict[str, torch.Tensor] = {}
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.options = resolve(options)
        self._prefix = PREFIX if loss_fn is not None else ""
        self._names = {p: n for n, p in model.named_parameters()}
        self.memory_plan = ""  # memory="auto": the plan chosen and the candidates planned
        OptimizerProgram(optimizer, self._names)  # reject unsupported optimizers now
        self._programs: Programs[Program] = Programs("training_model")
        self._device_newer = False
        self._hooks = [
            model.register_state_dict_pre_hook(lambda *_: self._sync()),
            optimizer.register_state_dict_pre_hook(lambda *_: self._sync()),
            model.register_load_state_dict_post_hook(lambda *_: self._torch_changed()),
        ]

    # the step ------------------------------------------------------------------------
    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        """One training step on ``inputs`` (with the target last when there is a loss_fn);
        returns the loss as a torch scalar."""
        prog = self._program(inputs)
        n, replicas = self.options.device_iterations, self.options.replication_factor
        hyper = broadcast_feeds(prog.optim.feeds_for(n), replicas, n)
        feeds = {**prog.inputs.feed(inputs), **hyper}
        out = prog.session.run(feeds)
        self._device_newer = True
        # the optimizer has stepped (on the device): torch's lr schedulers check this flag
        self.optimizer._opt_called = True
        # with replication: the loss as the mean over replicas, outputs in batch order
        values = unreplicated(prog.outputs, out, inputs, self.options)
        self.last = {k: v for k, v in values.items() if k != "loss"}
        return values["loss"]

    # programs ------------------------------------------------------------------------
    @property
    def _active(self) -> Program | None:
        return self._programs.active

    def _program(self, inputs: tuple) -> Program:
        sig = signature_of(self._model, inputs)
        build = lambda: self._build(sig, inputs)  # noqa: E731
        leave = lambda _: self.copy_weights_to_host()  # noqa: E731  (through torch)
        return self._programs.get(sig, build, leave, self._activate)

    def _activate(self, prog: Program) -> None:
        prog.weights.from_torch(prog.session)
        prog.session.write_variables_data(prog.optim.state_from_torch())
        self._device_newer = False

    def _build(self, sig: tuple, inputs: tuple) -> Program:
        notes = []
        if self.options.memory == "auto":  # chosen once, on the first signature
            plan = lambda options: self._what_if(sig, inputs, options)  # noqa: E731
            batch = inputs[0].shape[self.options.device_iterations > 1] if inputs else None
            choice = choose(self._model, self.options, plan, batch)
            log.info("%s", choice.text)
            self.options, self.memory_plan = choice.options, choice.text
            notes.append(choice.text)
        build = Build("training_model", self._model, self.options, self._prefix)
        build.notes += notes
        return build_training(build, sig, self._request(inputs, self.options))

    def _request(self, inputs: tuple, options: Options) -> TrainingRequest:
        has_loss_fn = self.loss_fn is not None
        root = self._model
        names = [f"input{i}" for i in range(len(inputs))]
        if has_loss_fn:
            root = with_loss(self._model, self.loss_fn, len(inputs) - 1, self._record)
            names[-1] = "target"
        return TrainingRequest(
            model=self._model,
            root=root,
            inputs=tuple(inputs),
            names=names,
            optimizer=OptimizerProgram(self.optimizer, self._names, replication_of(options)),
            has_loss_fn=has_loss_fn,
            record=self._record,
            contexts=(lambda: user_terms(self._model, self._prefix),),
        )

    def _what_if(self, sig: tuple, inputs: tuple, options: Options) -> Planned:
        """Plan the training program under ``options`` without copying weights or making a
        Session (`auto.choose`'s candidates)."""
        build = Build("training_model", self._model, options, self._prefix, plan_only=True)
        build_training(build, sig, self._request(inputs, options))
        peak = max(m.total for m in build.plan.memory.values())
        return Planned(options, peak, build.plan.cycles)

    # torch side ----------------------------------------------------------------------
    def copy_weights_to_host(self) -> None:
        """Write the simulated parameters, buffers and optimizer state into the torch model
        and optimizer (``model.state_dict()``/``optimizer.state_dict()`` become torch's own)."""
        prog = self._active
        if prog is None or not self._device_newer:
            return
        self._device_newer = False
        prog.weights.to_torch(prog.session)
        prog.optim.state_to_torch(prog.session.get_tensors_data(prog.optim.variables()))

    def _sync(self) -> None:
        self.copy_weights_to_host()

    def _torch_changed(self) -> None:
        """Weights loaded into the torch model: the device takes them before the next step."""
        if self._active is not None:
            self._active.weights.from_torch(self._active.session)
            self._device_newer = False

    @property
    def model(self) -> nn.Module:
        """The torch model, with the simulated weights copied into it."""
        self.copy_weights_to_host()
        return self._model


def training_model(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable | None = None,
    options: Options | None = None,
) -> Trainer:
    """A trainer that runs ``model``'s training step, with ``optimizer``, on the simulated IPU.

    Args:
        model: the torch model; its parameters and buffers initialise the program and receive
            the trained values back (`Trainer.copy_weights_to_host`).
        optimizer: a ``torch.optim.SGD``, ``Adam`` or ``AdamW`` over ``model``'s parameters
            (``fused=True`` runs torch's fused kernels); its hyper-parameters are read before
            every step (lr schedulers work).
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
    return Trainer(model, optimizer, loss_fn, resolve(options))
