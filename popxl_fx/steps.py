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
from popxl_core import ops

from .batch_serial import check_batch, serialise_step
from .built import Program
from .checks import check_inputs, integer_inputs_explained
from .loops import check_batches, micro_batch_loop, repeat_step
from .loss import check_scalar_loss, loss_index
from .names import unescape
from .optim import OptimizerProgram
from .phased import build_phased_training
from .pipeline import (
    Build,
    Lowered,
    accumulating_backward,
    backward,
    lower,
    master_gradients,
    reduce_gradients,
    weights_of,
)
from .precision import loss_seed, stream_values
from .program import Inputs, Weights, load_inputs, store
from .replication import check_batch_split, replica_examples, split_replicas

__all__ = ["Program", "build_inference", "build_training", "lower_for_compile"]


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
    """The training step program: forward, loss, backward, optimizer update (with
    gradient_accumulation or device_iterations: `build_training_loops`)."""
    opts = build.options
    if opts.phased_execution is not False:
        return build_phased_training(build, signature, req)
    if max(opts.gradient_accumulation, opts.device_iterations, opts.batch_serialisation) > 1:
        return build_training_loops(build, signature, req)
    check_inputs(req.model, req.inputs)
    check_batch_split(req.inputs, opts)
    examples = replica_examples(req.inputs, split_replicas(opts))  # one replica's share
    with build.ir.main_graph, popxl.in_sequence():
        ins = load_inputs(stream_values(opts, req.inputs), req.names, split_replicas(opts))
        lowered, index, trainable = _lower_with_loss(build, req, ins.tensors, examples)
        _some_trainable(trainable, req.model)
        fwd = lowered.forward
        args = fwd.args.to_dict()
        backward(build, lowered, [fwd.graph.outputs[index]], [args[n] for n in trainable])
        variables = lowered.facts.init()
        step = _plain_step(build, lowered, variables, ins, index)
        build.planned = True  # the main graph calls the step: later stages plan memory
        weights = weights_of(variables, lowered, build.prefix)
        grads = _optimizer_update(build, req, weights, step.grads)
        outputs = {"loss": store(step.loss, "loss")}
        if req.record:  # the gradients the optimizer steps with (float16: unscaled)
            outputs.update(_recorded(step.outputs, index, grads))
    session = build.session()
    return Program(
        signature, build.ir, session, ins, outputs, weights, lowered, build.stages, req.optimizer
    )


def _lower_with_loss(build: Build, req: TrainingRequest, specs, examples: tuple) -> tuple:
    """Trace and lower ``req.root`` on ``examples`` (one replica's, or one micro-batch's,
    inputs); returns the lowered graphs, the loss's output index (a scalar, checked) and the
    trainable parameters' names."""
    model_inputs = examples[:-1] if req.has_loss_fn else examples
    contexts = (lambda: integer_inputs_explained(req.model, model_inputs), *req.contexts)
    lowered = lower(build, req.root, specs, examples, contexts)
    outputs = lowered.forward.graph.outputs
    index = loss_index(lowered.fxm.out_spec, len(outputs), req.model)
    check_scalar_loss(outputs[index], req.model, req.has_loss_fn)
    return lowered, index, lowered.trainable()


def _optimizer_update(
    build: Build, req: TrainingRequest, weights: Weights, grads_of: dict, local=None
) -> dict:
    """The optimizer update of every parameter with a gradient in ``grads_of`` (variable ->
    gradient), after the gradients are reduced over replicas and unscaled to the float32
    masters; returns the gradients it steps with, by name. ``local``: in a repeated step, the
    step graph's stand-in of a main-graph variable (`optim.OptimizerProgram.build`)."""
    params = {name: weights.variables[name] for name in weights.names("param")}
    stepped = params if local is None else {name: local(v) for name, v in params.items()}
    grads = {name: grads_of[v] for name, v in params.items() if v in grads_of}
    grads = master_gradients(build, reduce_gradients(build, grads))
    req.optimizer.build(stepped, grads, local=local)
    build.record("optimizer", f"{type(req.optimizer.optimizer).__name__} var updates")
    return grads


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
    fwd_graph, bwd_graph = lowered.forward, lowered.backward
    fwd = fwd_graph.bind(variables).call_with_info(*ins.tensors)
    loss = fwd.outputs[index]
    info = bwd_graph.grad_graph_info
    seed = loss_seed(loss, build.options)
    bwd = bwd_graph.call_with_info(seed, args=info.inputs_dict(fwd))
    grads = info.fwd_parent_ins_to_grad_parent_outs(fwd, bwd)
    return _Step(loss, list(fwd.outputs), grads)


def _recorded(outputs: list[popxl.Tensor], index: int, grads: dict) -> dict:
    recorded = {f"output.{i}": store(t, f"output.{i}") for i, t in enumerate(outputs) if i != index}
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
        outs = self.lowered.forward.bind(_named(self.variables, local)).call(*ins.tensors)
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


def build_training_loops(build: Build, signature: Any, req: TrainingRequest) -> Program:
    """The training program with a micro-batch loop (k = gradient_accumulation), slices
    (s = batch_serialisation, `batch_serial`) and/or a device-iteration loop
    (n = device_iterations) around the step (see `loops`)."""
    step_inputs = _loop_step_inputs(build.options, req)
    with build.ir.main_graph, popxl.in_sequence():
        loop = _lower_loop_step(build, req, step_inputs)
        _call_loop_steps(loop)
    session = build.session()
    outputs = {"loss": loop.losses[0]}
    return Program(
        signature, build.ir, session, loop.loaded[0], outputs, loop.weights, loop.lowered,
        build.stages, req.optimizer,
    )  # fmt: skip


@dataclass
class _LoopStep:
    """One training step of `build_training_loops`, lowered; `_loop_step` calls it once per
    device iteration (or once, in the main graph)."""

    build: Build
    req: TrainingRequest
    step_inputs: tuple  # one step's torch inputs (the device-iteration dim dropped)
    micro: tuple  # what the forward graph sees: one slice of one micro-batch of one replica
    lowered: Lowered
    index: int  # the loss's forward output
    trainable: list[str]
    variables: addons.NamedTensors
    accum: addons.NamedTensors | None  # the gradient sums (k > 1 or s > 1)
    weights: Weights
    loaded: list[Inputs] = field(default_factory=list)
    losses: list[popxl.DeviceToHostStream] = field(default_factory=list)


def _loop_step_inputs(opts, req: TrainingRequest) -> tuple:
    """Check the inputs against k, s, n and the replicas; one step's inputs."""
    k, n, s = opts.gradient_accumulation, opts.device_iterations, opts.batch_serialisation
    check_inputs(req.model, req.inputs)
    check_batches(req.inputs, k, n)
    if req.record:
        raise NotImplementedError(
            "recording outputs and gradients (assert_matches_eager) compares single steps; "
            "it is not available with gradient_accumulation, batch_serialisation or "
            "device_iterations."
        )
    step_inputs = tuple(x[0] for x in req.inputs) if n > 1 else req.inputs
    if s > 1:
        check_batch(
            step_inputs, opts.batch_divisor // opts.replication_factor * split_replicas(opts), opts
        )
    check_batch_split(step_inputs, opts)
    return step_inputs


def _lower_loop_step(build: Build, req: TrainingRequest, step_inputs: tuple) -> _LoopStep:
    """Lower the forward on one slice of one micro-batch, its (accumulating) backward, and
    make the variables and gradient sums in the main graph."""
    opts = build.options
    parts = opts.gradient_accumulation * opts.batch_serialisation * split_replicas(opts)
    micro = tuple(x[: x.shape[0] // parts] for x in step_inputs)
    specs = [
        popxl.TensorSpec(tuple(x.shape), popxl.dtype.as_dtype(x.dtype))
        for x in stream_values(opts, micro)
    ]
    lowered, index, trainable = _lower_with_loss(build, req, specs, micro)
    fwd = lowered.forward
    args = fwd.args.to_dict()
    loss_out, required = fwd.graph.outputs[index], [args[t] for t in trainable]
    accum = None
    if _accumulates(opts):
        accum_facts, _ = accumulating_backward(build, lowered, loss_out, required)
        accum = accum_facts.init()
    else:
        backward(build, lowered, [loss_out], required)
    variables = lowered.facts.init()
    weights = weights_of(variables, lowered, build.prefix)
    return _LoopStep(
        build, req, step_inputs, micro, lowered, index, trainable, variables, accum, weights
    )


def _accumulates(opts) -> bool:
    """Gradients are summed over micro-batches or slices before the optimizer steps."""
    return opts.gradient_accumulation > 1 or opts.batch_serialisation > 1


def _call_loop_steps(loop: _LoopStep) -> None:
    """The step repeated n times per call (device iterations), or called once."""
    build, n = loop.build, loop.build.options.device_iterations
    if n > 1:
        build.ir.num_host_transfers = n
        repeat_step(build.ir, n, lambda local: _loop_step(loop, local))
        build.planned = True
        build.record("device_iterations", f"the step repeated {n} times per call")
    else:
        build.planned = _accumulates(build.options)  # the loops are called from the main graph
        _loop_step(loop, lambda t: t)


def _loop_step(loop: _LoopStep, local: Callable[[popxl.Tensor], popxl.Tensor]) -> None:
    """Load the step's inputs, run forward and backward (accumulating), update, store the
    loss. ``local`` maps a main-graph tensor to the current graph's stand-in."""
    build, req, opts = loop.build, loop.req, loop.build.options
    ins = load_inputs(stream_values(opts, loop.step_inputs), req.names, split_replicas(opts))
    loop.loaded.append(ins)
    named = _named(loop.variables, local)
    if _accumulates(opts):
        local_accum = _named(loop.accum, local)
        loss = _accumulated_step(
            build, loop.lowered, named, local_accum, ins, loop.index, loop.micro
        )
        sums, main = local_accum.to_dict(), loop.variables.to_dict()
        grads = {main[t]: sums[f"accum.{t}"] for t in loop.trainable}
    else:
        grads, loss = _local_step(build, loop.lowered, named, loop.variables, ins, loop.index)
    one_step = opts.device_iterations == 1
    _optimizer_update(build, req, loop.weights, grads, local=None if one_step else local)
    if _accumulates(opts):  # the next step's first accumulation overwrites the sums
        ops.var_updates.accumulator_scale_(local(loop.accum.mean_accum_counter), 0.0)
    loop.losses.append(store(loss, "loss"))


def _named(tensors: addons.NamedTensors, local: Callable) -> addons.NamedTensors:
    return addons.NamedTensors.from_dict({n: local(t) for n, t in tensors.to_dict().items()})


def _accumulated_step(
    build: Build, lowered: Lowered, named, accum, ins: Inputs, index: int, micro: tuple
) -> popxl.Tensor:
    """Forward and accumulating backward over the step's batch: k micro-batches
    (`loops.micro_batch_loop`) and/or s slices of each (`batch_serial.serialise_step`);
    returns the step's loss (the mean of the micro-batches' / slices' losses)."""
    opts = build.options
    k, s = opts.gradient_accumulation, opts.batch_serialisation
    fwd, bwd = lowered.forward, lowered.backward

    def sliced(variables, sums, xs) -> popxl.Tensor:
        copies = lowered.fxm.working_copies
        return serialise_step(
            fwd, bwd, variables, sums, xs, s, index, opts.loss_scaling, copies
        ).loss

    micro_step = sliced if s > 1 else None
    if k > 1:
        loss = micro_batch_loop(
            build.ir, fwd, bwd, named, accum, ins.tensors, k, index, micro_step,
            opts.loss_scaling,
        )  # fmt: skip
        rows = micro[0].shape[0] * s
        build.record(
            "accumulation",
            f"{k} micro-batches of {rows} rows: forward and backward repeated (ops.repeat), "
            "gradients mean-accumulated",
        )
    else:
        loss = sliced(named, accum, ins.tensors)
    if s > 1:
        build.record(
            "batch_serialisation",
            f"{s} slices per micro-batch, {micro[0].shape[0]} rows each: forward and backward "
            "loops, activations through remote buffers, gradients mean-accumulated",
        )
    return loss


def _local_step(build: Build, lowered: Lowered, named, variables, ins: Inputs, index: int) -> tuple:
    """One forward and backward call on ``named`` (the step graph's stand-ins for
    ``variables``); gradients keyed by the main graph's variables."""
    fwd_graph, bwd_graph = lowered.forward, lowered.backward
    fwd = fwd_graph.bind(named).call_with_info(*ins.tensors)
    loss = fwd.outputs[index]
    info = bwd_graph.grad_graph_info
    seed = loss_seed(loss, build.options)
    bwd = bwd_graph.call_with_info(seed, args=info.inputs_dict(fwd))
    by_local = info.fwd_parent_ins_to_grad_parent_outs(fwd, bwd)
    local_of = {named.to_dict()[name]: v for name, v in variables.to_dict().items()}
    return {local_of[t]: g for t, g in by_local.items() if t in local_of}, loss
