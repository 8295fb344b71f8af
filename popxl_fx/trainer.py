"""`training_model`: forward, loss, autodiff and a torch optimizer as one PopXL program.

One Ir and one Session are built per input signature (shapes, dtypes, train/eval mode) and
cached; switching signature goes through the torch model (device -> torch -> device), so every
program sees the same weights and optimizer state. The torch model and optimizer stay the
user's: `Trainer.copy_weights_to_host` (run automatically by ``model.state_dict()``,
``optimizer.state_dict()`` and `Trainer.model`) writes the simulated weights and optimizer state
into them in torch's own format.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree
from torch import nn

import addons
import popxl_core as popxl

from . import lowerings  # noqa: F401  (fills the lowering table)
from .checks import check_inputs, check_target, integer_inputs_explained
from .errors import Issue, UnsupportedError
from .module import Module
from .optim import OptimizerProgram
from .optim_replicated import Replication
from .options import Options, resolve
from .program import (
    Inputs,
    ProgramView,
    Weights,
    describe_change,
    load_inputs,
    log,
    make_session,
    signature_of,
    store,
)
from .replication import (
    broadcast_feeds,
    check_batch,
    mean_over_replicas,
    replica_examples,
    split_feeds,
)

__all__ = ["Trainer", "training_model"]

PREFIX = "model."  # where the model sits inside the loss wrapper


class WithLoss(nn.Module):
    """``loss_fn(model(*inputs), target)`` as one module, so the loss is traced and lowered
    through the same table as the model (a loss module is a leaf, a loss function a call)."""

    def __init__(self, model: nn.Module, loss_fn: Callable, with_output: bool = False) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn
        self.with_output = with_output

    # fx traces a fixed signature (no *args): one class per number of model inputs
    def forward(self, input0, target):
        return self._loss(self.model(input0), target)

    def _loss(self, out, target):
        # while traced, out and target are proxies carrying their example values
        check_target(_example_value(out), _example_value(target), self.loss_fn)
        loss = self.loss_fn(out, target)
        return (loss, out) if self.with_output else loss


class _WithLoss2(WithLoss):
    def forward(self, input0, input1, target):
        return self._loss(self.model(input0, input1), target)


class _WithLoss3(WithLoss):
    def forward(self, input0, input1, input2, target):
        return self._loss(self.model(input0, input1, input2), target)


@contextlib.contextmanager
def _user_terms(trainer: "Trainer") -> Iterator[None]:
    """Issues found in the loss wrapper, told in terms of the user's model: its class name,
    module paths and attributes without the wrapper's ``model.`` prefix."""
    try:
        yield
    except UnsupportedError as e:
        if not trainer._prefix:
            raise
        issues = [_unwrapped(issue, trainer._prefix) for issue in e.issues]
        raise UnsupportedError(type(trainer._model).__name__, issues) from None


def _unwrapped(issue: Issue, prefix: str) -> Issue:
    path = issue.module_path
    path = (
        path[len(prefix) :] if path.startswith(prefix) else ("" if path + "." == prefix else path)
    )
    return dataclasses.replace(issue, module_path=path, what=issue.what.replace(f"'{prefix}", "'"))


def _example_value(x: object) -> object:
    return x.node.meta.get("example_value") if isinstance(x, torch.fx.Proxy) else x


def with_loss(
    model: nn.Module, loss_fn: Callable, n_inputs: int, with_output: bool = False
) -> WithLoss:
    """The loss wrapper for a model taking ``n_inputs`` tensors (1 to 3)."""
    classes = {1: WithLoss, 2: _WithLoss2, 3: _WithLoss3}
    if n_inputs not in classes:
        raise ValueError(
            f"with loss_fn, the model takes 1 to 3 inputs (got {n_inputs}); "
            "return the loss from forward instead."
        )
    return classes[n_inputs](model, loss_fn, with_output)


@dataclass
class _Program:
    """One compiled training step."""

    signature: tuple
    ir: popxl.Ir
    session: popxl.Session
    inputs: Inputs
    loss_stream: popxl.DeviceToHostStream
    weights: Weights
    optim: OptimizerProgram
    forward: addons.GraphWithNamedArgs
    backward: addons.GraphWithNamedArgs
    recorded: dict[str, popxl.DeviceToHostStream]  # outputs and gradients, with `record`


def _loss_index(fxm: Module, n_outputs: int, model: nn.Module) -> int:
    """Which flattened output is the loss: the tensor, ``out["loss"]`` or ``out[0]``."""
    where = pytree.tree_unflatten(list(range(n_outputs)), fxm.out_spec)
    if isinstance(where, dict) and "loss" in where:
        where = where["loss"]
    elif isinstance(where, (tuple, list)) and where:
        where = where[0]
    if not isinstance(where, int):
        raise ValueError(
            f"{type(model).__name__}.forward returns {type(where).__name__} without a loss; "
            "return the loss (a tensor, a tuple starting with it, or a dict with 'loss') or "
            "pass loss_fn=."
        )
    return where


def _scalar_loss(loss: popxl.Tensor, model: nn.Module, has_loss_fn: bool) -> None:
    if loss.shape == () and loss.dtype.is_floating_point:
        return
    what = "loss_fn" if has_loss_fn else f"{type(model).__name__}.forward"
    hint = "reduce it (reduction='mean')" if has_loss_fn else "pass loss_fn=, e.g. F.cross_entropy"
    raise ValueError(
        f"training_model needs a scalar float loss, but {what} returns a tensor of shape "
        f"{tuple(loss.shape)} ({loss.dtype.name}); {hint}."
    )


class Trainer(ProgramView):
    """The callable `training_model` returns: ``trainer(*inputs[, target])`` runs one step."""

    _not_called = "the trainer has not been called yet: run one step first."

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
        OptimizerProgram(optimizer, self._names)  # reject unsupported optimizers now
        self._programs: dict[tuple, _Program] = {}
        self._active: _Program | None = None
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
        replicas = self.options.replication_factor
        feeds = {
            **split_feeds(prog.inputs.feed(inputs), replicas),
            **broadcast_feeds(prog.optim.feeds(), replicas),
        }
        out = prog.session.run(feeds)
        self._device_newer = True
        # the optimizer has stepped (on the device): torch's lr schedulers check this flag
        self.optimizer._opt_called = True
        self.last = {k: torch.from_numpy(out[s].copy()) for k, s in prog.recorded.items()}
        return mean_over_replicas(out[prog.loss_stream], replicas)

    # programs ------------------------------------------------------------------------
    def _program(self, inputs: tuple) -> _Program:
        sig = signature_of(self._model, inputs)
        if self._active is not None and self._active.signature == sig:
            return self._active
        if self._active is not None:
            log.info(
                "training_model: recompiling, %s", describe_change(self._active.signature, sig)
            )
            self.copy_weights_to_host()
        prog = self._programs.get(sig) or self._build(sig, inputs)
        self._programs[sig] = prog
        self._activate(prog)
        return prog

    def _activate(self, prog: _Program) -> None:
        prog.weights.from_torch(prog.session)
        prog.session.write_variables_data(prog.optim.state_from_torch())
        self._active, self._device_newer = prog, False

    def _build(self, sig: tuple, inputs: tuple) -> _Program:
        check_inputs(self._model, inputs)
        check_batch(inputs, self.options)
        replicas = self.options.replication_factor
        inputs = replica_examples(inputs, replicas)  # one replica's program
        root = self._model
        if self.loss_fn is not None:
            root = with_loss(self._model, self.loss_fn, len(inputs) - 1, self._record)
        ir = popxl.Ir(replication=replicas)
        with ir.main_graph, popxl.in_sequence():
            names = [f"input{i}" for i in range(len(inputs))]
            if self.loss_fn is not None:
                names[-1] = "target"
            ins = load_inputs(inputs, names)
            fxm = Module(root, flatten_outputs=True)
            model_inputs = inputs[:-1] if self.loss_fn is not None else inputs
            with integer_inputs_explained(self._model, model_inputs), _user_terms(self):
                fxm.capture(*inputs)  # trace on the user's inputs (real branches and indices)
                facts, fwd_graph = fxm.create_graph(*ins.tensors)
            index = _loss_index(fxm, len(fwd_graph.graph.outputs), self._model)
            _scalar_loss(fwd_graph.graph.outputs[index], self._model, self.loss_fn is not None)
            args = fwd_graph.args.to_dict()
            torch_names = fxm.torch_names()
            trainable = [n for n, t in args.items() if _trainable(torch_names.get(n))]
            bwd_graph = addons.autodiff(
                fwd_graph,
                grads_provided=[fwd_graph.graph.outputs[index]],
                grads_required=[args[n] for n in trainable],
            )
            variables = facts.init()
            fwd = fwd_graph.bind(variables).call_with_info(*ins.tensors)
            loss = fwd.outputs[index]
            info = bwd_graph.grad_graph_info
            one = popxl.constant(1.0, loss.dtype, "loss_grad")
            bwd = bwd_graph.call_with_info(one, args=info.inputs_dict(fwd))
            grads = info.fwd_parent_ins_to_grad_parent_outs(fwd, bwd)
            weights = Weights.from_named(variables.to_dict(), torch_names, self._prefix)
            replication = Replication(replicas, self.options.replicated_tensor_sharding)
            optim = OptimizerProgram(self.optimizer, self._names, replication)
            params = {n: weights.variables[n] for n in weights.names("param")}
            optim.build(params, {n: grads[v] for n, v in params.items() if v in grads})
            loss_stream = store(loss, "loss")
            recorded = {}
            if self._record:
                recorded = {
                    f"output.{i}": store(t, f"output.{i}")
                    for i, t in enumerate(fwd.outputs)
                    if i != index
                }
                recorded.update(
                    {
                        f"grad.{n}": store(grads[v], f"grad.{n}")
                        for n, v in params.items()
                        if v in grads
                    }
                )
        session = make_session(ir, self.options, self._prefix)
        session.__enter__()  # stays attached: weights live on the device between steps
        return _Program(
            sig, ir, session, ins, loss_stream, weights, optim, fwd_graph, bwd_graph, recorded
        )

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


def _trainable(entry: tuple | None) -> bool:
    return entry is not None and entry[0] == "param" and entry[1].requires_grad


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
