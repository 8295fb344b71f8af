"""What each entry point asks of the pipeline: the programs of `training_model`,
`inference_model` and `compile`, each assembled from the stages of `pipeline`.

- `build_training`: inputs -> forward -> loss -> backward -> optimizer (one step per call,
  or per micro-batch loop / device iteration, see `training_step`);
- `build_inference`: inputs -> forward -> outputs;
- `lower_for_compile`: the forward graph and the gradient graph that `compile`'s forward and
  backward programs both build (the same graphs, so positions agree between the two).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

import addons
import popxl_core as popxl

from .checks import check_inputs, integer_inputs_explained
from .loss import check_scalar_loss, loss_index
from .optim import OptimizerProgram
from .pipeline import Build, Lowered, Stage, backward, lower, weights_of
from .program import Inputs, Weights, load_inputs, store
from .replication import check_batch, record_replication, replica_examples

__all__ = ["Program", "build_inference", "build_training", "lower_for_compile"]


@dataclass
class Program:
    """One built program of any entry point.

    ``outputs`` are the device-to-host streams by name: "loss" (training), "output.<i>" (the
    forward's flattened outputs), "grad.<name>" (training with ``record``).
    """

    signature: Any
    ir: popxl.Ir
    session: popxl.Session
    inputs: Inputs
    outputs: dict[str, popxl.DeviceToHostStream]
    weights: Weights
    lowered: Lowered
    stages: list[Stage]
    optim: OptimizerProgram | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # what one entry point alone needs

    @property
    def forward(self) -> addons.GraphWithNamedArgs:
        return self.lowered.forward

    @property
    def backward(self) -> addons.GraphWithNamedArgs | None:
        return self.lowered.backward


# training ----------------------------------------------------------------------------------
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


def build_training(build: Build, signature: Any, req: TrainingRequest) -> Program:
    """The training step program: forward, loss, backward, optimizer update."""
    model_inputs = req.inputs[:-1] if req.has_loss_fn else req.inputs
    check_inputs(req.model, req.inputs)
    check_batch(req.inputs, build.options)
    replicas = build.options.replication_factor
    examples = replica_examples(req.inputs, replicas)  # one replica's share of the batch
    contexts = (lambda: integer_inputs_explained(req.model, model_inputs), *req.contexts)
    with build.ir.main_graph, popxl.in_sequence():
        ins = load_inputs(req.inputs, req.names, replicas)
        lowered = lower(build, req.root, ins.tensors, examples, contexts)
        fwd = lowered.forward
        index = loss_index(lowered.fxm.out_spec, len(fwd.graph.outputs), req.model)
        check_scalar_loss(fwd.graph.outputs[index], req.model, req.has_loss_fn)
        args = fwd.args.to_dict()
        trainable = lowered.trainable()
        backward(build, lowered, [fwd.graph.outputs[index]], [args[n] for n in trainable])
        variables = lowered.facts.init()
        step = _plain_step(build, lowered, variables, ins, index)
        weights = weights_of(variables, lowered, build.prefix)
        params = {n: weights.variables[n] for n in weights.names("param")}
        grads = {n: step.grads[v] for n, v in params.items() if v in step.grads}
        record_replication(build)  # the optimizer reduces the gradients over the replicas
        req.optimizer.build(params, grads)
        build.record("optimizer", f"{type(req.optimizer.optimizer).__name__} var updates")
        outputs = {"loss": store(step.loss, "loss")}
        if req.record:
            outputs.update(_recorded(step.outputs, index, grads))
    session = build.session()
    return Program(
        signature, build.ir, session, ins, outputs, weights, lowered, build.stages, req.optimizer
    )


@dataclass
class _Step:
    loss: popxl.Tensor
    outputs: list[popxl.Tensor]  # the forward's outputs (the loss among them)
    grads: dict[popxl.Tensor, popxl.Tensor]  # variable -> its gradient


def _plain_step(build: Build, lowered: Lowered, variables, ins: Inputs, index: int) -> _Step:
    """One forward and one backward call in the main graph (no accumulation)."""
    fwd_graph, bwd_graph = lowered.forward, lowered.backward
    fwd = fwd_graph.bind(variables).call_with_info(*ins.tensors)
    loss = fwd.outputs[index]
    info = bwd_graph.grad_graph_info
    one = popxl.constant(1.0, loss.dtype, "loss_grad")
    bwd = bwd_graph.call_with_info(one, args=info.inputs_dict(fwd))
    grads = info.fwd_parent_ins_to_grad_parent_outs(fwd, bwd)
    return _Step(loss, list(fwd.outputs), grads)


def _recorded(outputs: list[popxl.Tensor], index: int, grads: dict) -> dict:
    recorded = {f"output.{i}": store(t, f"output.{i}") for i, t in enumerate(outputs) if i != index}
    recorded.update({f"grad.{n}": store(g, f"grad.{n}") for n, g in grads.items()})
    return recorded


# inference ---------------------------------------------------------------------------------
def build_inference(build: Build, signature: Any, inputs: Sequence[torch.Tensor]) -> Program:
    """The forward program: inputs in, the forward's flattened outputs out."""
    check_inputs(build.model, inputs)
    check_batch(inputs, build.options, training=False)
    replicas = build.options.replication_factor
    contexts = (lambda: integer_inputs_explained(build.model, inputs),)
    with build.ir.main_graph, popxl.in_sequence():
        ins = load_inputs(inputs, [f"input{i}" for i in range(len(inputs))], replicas)
        examples = replica_examples(inputs, replicas)
        lowered = lower(build, build.model, ins.tensors, examples, contexts)
        variables = lowered.facts.init()
        outs = lowered.forward.bind(variables).call(*ins.tensors)
        outputs = {f"output{i}": store(t, f"output{i}") for i, t in enumerate(outs)}
        weights = weights_of(variables, lowered)
    session = build.session()
    return Program(signature, build.ir, session, ins, outputs, weights, lowered, build.stages)


# compile -----------------------------------------------------------------------------------
@dataclass
class CompiledGraphs:
    """What `compile` needs besides the graphs: output count and gradient positions."""

    lowered: Lowered
    n_outputs: int  # the forward's own outputs (activations follow)
    trainable: list[str]  # parameter names whose gradients the gradient graph returns
    input_positions: dict[popxl.Tensor, int] = field(default_factory=dict)


def lower_for_compile(
    build: Build, specs: list, wants: list[bool] | None, examples: tuple
) -> CompiledGraphs:
    """The forward graph, and its gradient graph unless ``wants`` (per input) is None; traced
    on ``examples``, the user's first inputs of this signature (real branches and indices)."""
    contexts = (lambda: integer_inputs_explained(build.model, examples),)
    lowered = lower(build, build.model, specs, examples, contexts)
    fwd = lowered.forward
    n_outputs = len(fwd.graph.outputs)
    if wants is None:
        return CompiledGraphs(lowered, n_outputs, [])
    args = fwd.args.to_dict()
    trainable = lowered.trainable()
    data_inputs = list(fwd.graph.inputs[: len(specs)])
    required = [args[n] for n in trainable] + [t for t, w in zip(data_inputs, wants) if w]
    provided = [t for t in fwd.graph.outputs if t.dtype.is_floating_point]
    backward(build, lowered, provided, required)
    positions = {t: i for i, t in enumerate(data_inputs)}
    return CompiledGraphs(lowered, n_outputs, trainable, positions)
