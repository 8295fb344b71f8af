"""What the training steps share (`steps`, `step_loops`, `phased`): the request of
`training_model` for one signature, the forward lowered with its loss, and the optimizer
update of the parameters from their gradients (`update_parameters`, every shape's).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from torch import nn

import addons
import popxl_core as popxl

from .checks import integer_inputs_explained
from .loss import check_scalar_loss, loss_index
from .optim import OptimizerProgram
from .pipeline import Build, Lowered, lower, master_gradients, reduce_gradients
from .precision import loss_seed, stream_values
from .program import Inputs, Weights, load_inputs
from .replication import split_replicas

__all__ = [
    "TrainingRequest",
    "forward_backward",
    "load_step_inputs",
    "lower_with_loss",
    "named_locals",
    "optimizer_update",
    "training_contexts",
    "update_parameters",
]


@dataclass
class TrainingRequest:
    """What `training_model` asks for one signature."""

    model: nn.Module  # the user's model
    root: nn.Module  # what is traced: the model, or the loss wrapper around it
    inputs: tuple  # the user's torch inputs (target last with a loss_fn)
    names: list[str]  # stream names of the inputs
    optimizer: OptimizerProgram
    has_loss_fn: bool
    record: bool  # also fetch forward outputs and gradients (tests)
    contexts: Sequence[Callable] = ()
    outputs: bool = False  # also fetch the forward's other outputs (PopTorch's executors)
    # PopTorch trains a loss that no trainable parameter reaches (nothing to update); eager's
    # backward() raises there, and so does popxl_fx's own entry point
    untrained_ok: bool = False


def load_step_inputs(build: Build, req: TrainingRequest, step_inputs: Sequence) -> Inputs:
    """One step's inputs loaded in the current graph, as the options stream them (float16,
    narrowed 64-bit), each replica its share: every shape of step loads them so."""
    opts = build.options
    return load_inputs(stream_values(opts, step_inputs), req.names, split_replicas(opts))


def training_contexts(req: TrainingRequest, inputs: Sequence) -> tuple:
    """What a training step's capture and lowering run inside (every shape's): the model's
    integer inputs explained (``inputs`` without the target), then the request's own (errors
    in the user's terms)."""
    model_inputs = inputs[:-1] if req.has_loss_fn else inputs
    return (lambda: integer_inputs_explained(req.model, model_inputs), *req.contexts)


def lower_with_loss(build: Build, req: TrainingRequest, specs, examples: tuple) -> tuple:
    """Trace and lower ``req.root`` on ``examples`` (one replica's, or one micro-batch's,
    inputs); returns the lowered graphs, the loss's output index (a scalar, checked) and the
    trainable parameters' names."""
    lowered = lower(build, req.root, specs, examples, training_contexts(req, examples))
    outputs = lowered.forward.graph.outputs
    index = loss_index(lowered.fxm.out_spec, len(outputs), req.model)
    check_scalar_loss(outputs[index], req.model, req.has_loss_fn)
    return lowered, index, lowered.trainable()


def optimizer_update(
    build: Build,
    req: TrainingRequest,
    weights: Weights,
    grads_of: dict,
    local=None,
    lowered: Lowered | None = None,
) -> dict:
    """The optimizer update of every parameter with a gradient in ``grads_of`` (variable ->
    gradient), after the gradients are reduced over replicas and unscaled to the float32
    masters; returns the gradients it steps with, by name. ``local``: in a repeated step, the
    step graph's stand-in of a main-graph variable (`optim.OptimizerProgram.build`).
    ``lowered``: with outlined blocks, each block's update is outlined too (`optim_outline`)."""
    params = {name: weights.variables[name] for name in weights.names("param")}
    stepped = params if local is None else {name: local(v) for name, v in params.items()}
    grads = {name: grads_of[v] for name, v in params.items() if v in grads_of}
    blocks = lowered.outlined_blocks(build.prefix) if lowered is not None else []
    return update_parameters(build, req.optimizer, stepped, grads, local=local, blocks=blocks)


def update_parameters(
    build: Build,
    optimizer: OptimizerProgram,
    params: Mapping[str, popxl.Tensor],
    grads: Mapping[str, popxl.Tensor],
    record: bool = True,
    **where,
) -> dict:
    """The optimizer update that every shape of step builds, from ``grads`` by parameter
    name: reduced over replicas (`pipeline.reduce_gradients`), unscaled to float32 masters
    (`pipeline.master_gradients`), then the optimizer's var updates of ``params``; returns
    the gradients it steps with. ``where``: `OptimizerProgram.build`'s ``local`` and
    ``blocks``. ``record=False``: the caller records the stages (the phased step updates
    phase by phase and records them once)."""
    grads = master_gradients(build, reduce_gradients(build, dict(grads), record), record)
    optimizer.build(params, grads, **where)
    if record:
        build.record("optimizer", f"{type(optimizer.optimizer).__name__} var updates")
    return grads


def named_locals(tensors: addons.NamedTensors, local: Callable) -> addons.NamedTensors:
    """``tensors`` with each main-graph tensor replaced by ``local``'s stand-in for it."""
    return addons.NamedTensors.from_dict({n: local(t) for n, t in tensors.to_dict().items()})


def forward_backward(build: Build, lowered: Lowered, bound, tensors: Sequence, index: int) -> tuple:
    """The forward graph called on ``bound`` variables and ``tensors``, then the backward
    seeded at output ``index`` (the loss): ``(forward call info, loss, {variable: gradient})``
    with the gradients keyed by the tensors ``bound`` binds."""
    fwd = lowered.forward.bind(bound).call_with_info(*tensors)
    loss = fwd.outputs[index]
    backward = lowered.backward
    assert backward is not None  # a training step's lowering has its backward
    info = backward.grad_graph_info
    seed = loss_seed(loss, build.options)
    bwd = backward.call_with_info(seed, args=info.inputs_dict(fwd))
    return fwd, loss, info.fwd_parent_ins_to_grad_parent_outs(fwd, bwd)
