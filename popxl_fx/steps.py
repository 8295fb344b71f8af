"""What each entry point asks of the pipeline: the programs of `training_model`,
`inference_model` and `compile`, each assembled from the stages of `pipeline`.

- `build_training`: inputs -> forward -> loss -> backward -> optimizer, in the step's shape
  (`shape_of`: `PlainShape`, one step per call; `step_loops.LoopShape`, per micro-batch loop
  / device iteration; `phased.PhasedShape`, phase by phase);
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

from .built import BuiltStep, Program, StepShape
from .checks import check_inputs, integer_inputs_explained
from .loops import check_batches, repeat_step
from .names import unescape
from .options import Options
from .phased import PhasedShape
from .pipeline import Build, Lowered, backward, lower, weights_of
from .precision import stream_values
from .program import Inputs, load_inputs, store
from .replication import check_batch_split, replica_examples, split_replicas
from .step_loops import LoopShape
from .step_parts import (
    TrainingRequest,
    forward_backward,
    load_step_inputs,
    lower_with_loss,
    named_locals,
    optimizer_update,
)

__all__ = [
    "CompiledGraphs",
    "Program",
    "TrainingRequest",
    "build_inference",
    "build_training",
    "lower_for_compile",
    "shape_of",
]


# training ----------------------------------------------------------------------------------
def build_training(build: Build, signature: Any, req: TrainingRequest) -> Program:
    """The training step program: forward, loss, backward, optimizer update, in the shape the
    options ask for (`shape_of`). The input checks, the main graph and the `Program` are
    written here once; what differs per shape is the shape's (`built.StepShape`)."""
    shape = shape_of(build.options)
    shape.refuse(build, req)
    check_inputs(req.model, req.inputs)
    step_inputs = shape.step_inputs(build, req)
    check_batch_split(step_inputs, build.options)
    captured = shape.capture(build, req, step_inputs)
    with build.ir.main_graph, popxl.in_sequence():
        step = shape.build(build, req, step_inputs, captured)
    session = build.session()
    return Program(
        signature, build.ir, session, step.inputs, step.outputs, step.weights, step.lowered,
        build.stages, req.optimizer, step.extra,
    )  # fmt: skip


def shape_of(opts: Options) -> StepShape:
    """The step's shape: phases (phased_execution), loops (gradient_accumulation,
    device_iterations, batch_serialisation) or plain."""
    if opts.phased_execution is not False:
        return PhasedShape()
    if max(opts.gradient_accumulation, opts.device_iterations, opts.batch_serialisation) > 1:
        return LoopShape()
    return PlainShape()


class PlainShape(StepShape):
    """One forward, one backward and one optimizer update per call, in the main graph."""

    def build(self, build: Build, req: TrainingRequest, step_inputs: tuple, captured) -> BuiltStep:
        examples = replica_examples(step_inputs, split_replicas(build.options))  # one replica's
        ins = load_step_inputs(build, req, step_inputs)
        lowered, index, trainable = lower_with_loss(build, req, ins.tensors, examples)
        if not req.untrained_ok:
            _some_trainable(trainable, req.model)
        fwd = lowered.forward
        args = fwd.args.to_dict()
        backward(build, lowered, [fwd.graph.outputs[index]], [args[n] for n in trainable])
        variables = lowered.facts.init()
        step = _plain_step(build, lowered, variables, ins, index)
        build.planned = True  # the main graph calls the step: later stages plan memory
        weights = weights_of(variables, lowered, build.prefix)
        grads = optimizer_update(build, req, weights, step.grads, lowered=lowered)
        outputs = {"loss": store(step.loss, "loss")}
        model_outs = _ModelOutputs(step.outputs, list(fwd.graph.outputs), index, outputs["loss"])
        if req.record:  # the gradients the optimizer steps with (float16: unscaled)
            outputs.update(_recorded(model_outs, len(step.outputs), grads))
        elif req.outputs:  # the model's outputs, not those autodiff added for the backward
            outputs.update(model_outs.stored(lowered.fxm.out_spec.num_leaves))
        return BuiltStep(ins, outputs, weights, lowered)


def _some_trainable(trainable: list[str], model: nn.Module) -> None:
    """Eager's ``loss.backward()`` raises when nothing requires grad; so does the trainer
    (it would otherwise train "successfully" with a constant loss)."""
    if not trainable:
        raise RuntimeError(
            f"no parameter of {type(model).__name__} that the loss depends on requires grad, so "
            "there is nothing to train (eager's loss.backward() raises 'element 0 of tensors "
            "does not require grad'); set requires_grad=True on the parameters to train, or use "
            "popxl_fx.inference_model."
        )


@dataclass
class _Step:
    loss: popxl.Tensor
    outputs: list[popxl.Tensor]  # the forward's outputs (the loss among them)
    grads: dict[popxl.Tensor, popxl.Tensor]  # variable -> its gradient


def _plain_step(build: Build, lowered: Lowered, variables, ins: Inputs, index: int) -> _Step:
    """One forward and one backward call in the main graph (no accumulation)."""
    fwd, loss, grads = forward_backward(build, lowered, variables, ins.tensors, index)
    return _Step(loss, list(fwd.outputs), grads)


@dataclass
class _ModelOutputs:
    """The forward call's outputs (``outer``; ``inner``: the forward graph's), the loss's
    position among them and the loss's d2h stream."""

    outer: list[popxl.Tensor]
    inner: list[popxl.Tensor]
    index: int
    loss_stream: Any

    def stored(self, n: int) -> dict:
        """The first ``n`` outputs but the loss, each through a d2h stream of its own; one
        that is the loss itself (a model returning its loss, as PopTorch's models do, beside
        the loss the trainer takes) reads the loss's stream: one transfer, not two."""
        streams = {}
        for i, t in enumerate(self.outer[:n]):
            if i == self.index:
                continue
            the_loss = self.inner[i] is self.inner[self.index]
            streams[f"output.{i}"] = self.loss_stream if the_loss else store(t, f"output.{i}")
        return streams


def _recorded(outputs: _ModelOutputs, n: int, grads: dict) -> dict:
    recorded = outputs.stored(n)
    # keyed by the exact torch name (variable names escape names like RegNet's "block1-0")
    recorded.update({f"grad.{unescape(n)}": store(g, f"grad.{n}") for n, g in grads.items()})
    return recorded


# inference ---------------------------------------------------------------------------------
def build_inference(build: Build, signature: Any, inputs: Sequence[torch.Tensor]) -> Program:
    """The forward program: inputs in, the forward's flattened outputs out (with
    device_iterations=n: n forwards per call, inputs and outputs with a leading n)."""
    n = build.options.device_iterations
    check_inputs(build.model, inputs)
    check_batches(inputs, 1, n)
    one = tuple(x[0] for x in inputs) if n > 1 else tuple(inputs)  # one iteration's inputs
    check_batch_split(one, build.options, training=False)
    calls = _ForwardCalls(build, one, [f"input{i}" for i in range(len(inputs))])
    with build.ir.main_graph, popxl.in_sequence():
        ins = calls.load() if n == 1 else None  # the plain program loads in the main graph
        calls.lower(ins)
        if n == 1:
            calls.forward(lambda t: t, ins)
            build.planned = True
        else:
            build.ir.num_host_transfers = n
            repeat_step(build.ir, n, calls.forward)
            build.planned = True
            build.record("device_iterations", f"the forward repeated {n} times per call")
        assert calls.lowered is not None  # `calls.lower` made it
        weights = weights_of(calls.variables, calls.lowered)
    session = build.session()
    return Program(
        signature, build.ir, session, calls.loaded[0], calls.outputs, weights, calls.lowered,
        build.stages,
    )  # fmt: skip


@dataclass
class _ForwardCalls:
    """`build_inference`'s forward: lowered once, called once or once per device iteration."""

    build: Build
    one: tuple  # one iteration's torch inputs
    names: list[str]
    lowered: Lowered | None = None
    variables: addons.NamedTensors | None = None
    loaded: list[Inputs] = field(default_factory=list)
    outputs: dict[str, popxl.DeviceToHostStream] = field(default_factory=dict)

    def load(self) -> Inputs:
        values = stream_values(self.build.options, self.one)
        return load_inputs(values, self.names, split_replicas(self.build.options))

    def lower(self, ins: Inputs | None) -> None:
        """Trace on one replica's share of one iteration; make the variables."""
        build = self.build
        examples = replica_examples(self.one, split_replicas(build.options))
        if ins is not None:
            specs: Sequence[Any] = ins.tensors
        else:
            specs = [
                popxl.TensorSpec(tuple(x.shape), popxl.dtype.as_dtype(x.dtype))
                for x in stream_values(build.options, examples)
            ]
        contexts = (lambda: integer_inputs_explained(build.model, self.one),)
        self.lowered = lower(build, build.model, specs, examples, contexts, differentiated=False)
        self.variables = self.lowered.facts.init()

    def forward(self, local: Callable[[popxl.Tensor], popxl.Tensor], ins=None) -> None:
        ins = ins or self.load()
        self.loaded.append(ins)
        assert self.lowered is not None and self.variables is not None  # `lower` made them
        outs = self.lowered.forward.bind(named_locals(self.variables, local)).call(*ins.tensors)
        self.outputs.update({f"output{i}": store(t, f"output{i}") for i, t in enumerate(outs)})


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
    lowered = lower(build, build.model, specs, examples, contexts, wants is not None)
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
