"""`training_model`'s program with loops around the step: k micro-batches
(gradient_accumulation), s slices of each (batch_serialisation) and/or n steps per call
(device_iterations); `steps.build_training` builds such options' step in `LoopShape`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import addons
import popxl_core as popxl
from popxl_core import ops

from .batch_serial import check_batch, serialise_step
from .built import BuiltStep, StepShape
from .loops import check_batches, micro_batch_loop, repeat_step
from .pipeline import Build, Lowered, accumulating_backward, backward, weights_of
from .precision import stream_values
from .program import Inputs, Weights, store
from .replication import split_replicas
from .step_parts import (
    TrainingRequest,
    forward_backward,
    load_step_inputs,
    lower_with_loss,
    named_locals,
    optimizer_update,
)

__all__ = ["LoopShape"]


class LoopShape(StepShape):
    """The training step with a micro-batch loop (k = gradient_accumulation), slices
    (s = batch_serialisation, `batch_serial`) and/or a device-iteration loop
    (n = device_iterations) around it (see `loops`)."""

    def step_inputs(self, build: Build, req: TrainingRequest) -> tuple:
        return _loop_step_inputs(build.options, req)

    def build(self, build: Build, req: TrainingRequest, step_inputs: tuple, captured) -> BuiltStep:
        loop = _lower_loop_step(build, req, step_inputs)
        _call_loop_steps(loop)
        outputs = {"loss": loop.losses[0], **loop.forward_outputs}
        return BuiltStep(loop.loaded[0], outputs, loop.weights, loop.lowered)


@dataclass
class _LoopStep:
    """One training step of `LoopShape`, lowered; `_loop_step` calls it once per
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
    # req.outputs: without accumulation the model's other outputs, one per step
    # ("output.{i}"); with it every output of every micro-batch ("micro.{i}", [k, ...])
    forward_outputs: dict[str, popxl.DeviceToHostStream] = field(default_factory=dict)


def _loop_step_inputs(opts, req: TrainingRequest) -> tuple:
    """Check the inputs against k, s and n (`steps.build_training` checks them against the
    replicas); one step's inputs."""
    k, n, s = opts.gradient_accumulation, opts.device_iterations, opts.batch_serialisation
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
    lowered, index, trainable = lower_with_loss(build, req, specs, micro)
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


def _n_leaves(lowered: Lowered) -> int:
    """How many leaves the forward's output has (flattened: its structure is kept when built)."""
    spec = lowered.fxm.out_spec
    assert spec is not None  # the step's module flattens its outputs
    return spec.num_leaves


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
    ins = load_step_inputs(build, req, loop.step_inputs)
    loop.loaded.append(ins)
    named = named_locals(loop.variables, local)
    if _accumulates(opts):
        assert loop.accum is not None  # made when the step accumulates
        local_accum = named_locals(loop.accum, local)
        loss, kept = _accumulated_step(
            build, loop.lowered, named, local_accum, ins, loop.index, loop.micro, req.outputs
        )
        loop.forward_outputs.update({f"micro.{i}": store(t, f"micro.{i}") for i, t in kept})
        sums, main = local_accum.to_dict(), loop.variables.to_dict()
        grads = {main[t]: sums[f"accum.{t}"] for t in loop.trainable}
    else:
        grads, loss, outs = _local_step(build, loop.lowered, named, loop.variables, ins, loop.index)
        if req.outputs:  # the model's outputs, not those autodiff added for the backward
            n = _n_leaves(loop.lowered)
            loop.forward_outputs.update(
                {f"output.{i}": store(t, f"output.{i}") for i, t in enumerate(outs[:n])
                 if i != loop.index}
            )  # fmt: skip
    one_step = opts.device_iterations == 1
    local_ = None if one_step else local
    optimizer_update(build, req, loop.weights, grads, local=local_, lowered=loop.lowered)
    if _accumulates(opts):  # the next step's first accumulation overwrites the sums
        assert loop.accum is not None
        ops.var_updates.accumulator_scale_(local(loop.accum.mean_accum_counter), 0.0)
    loop.losses.append(store(loss, "loss"))


def _accumulated_step(
    build: Build,
    lowered: Lowered,
    named,
    accum,
    ins: Inputs,
    index: int,
    micro: tuple,
    outputs: bool = False,
) -> tuple[popxl.Tensor, list[tuple[int, popxl.Tensor]]]:
    """Forward and accumulating backward over the step's batch: k micro-batches
    (`loops.micro_batch_loop`) and/or s slices of each (`batch_serial.serialise_step`);
    returns the step's loss (the mean of the micro-batches' / slices' losses) and, with
    ``outputs`` (k > 1, s = 1), each model output's k values by output index."""
    opts = build.options
    k, s = opts.gradient_accumulation, opts.batch_serialisation
    fwd, bwd = lowered.forward, lowered.backward
    assert bwd is not None  # a training step's lowering has its backward

    def sliced(variables, sums, xs) -> popxl.Tensor:
        copies = lowered.fxm.working_copies
        return serialise_step(
            fwd, bwd, variables, sums, xs, s, index, opts.loss_scaling, copies
        ).loss

    micro_step = sliced if s > 1 else None
    keep = range(_n_leaves(lowered)) if outputs and k > 1 and s == 1 else ()
    kept: list = []
    if k > 1:
        loss, kept = micro_batch_loop(
            build.ir, fwd, bwd, named, accum, ins.tensors, k, index, micro_step,
            opts.loss_scaling, keep,
        )  # fmt: skip
        _record_accumulation(build, k, micro[0].shape[0] * s)
    else:
        loss = sliced(named, accum, ins.tensors)
    if s > 1:  # (right after the accumulation's record with k > 1: the same program)
        build.record(
            "batch_serialisation",
            f"{s} slices per micro-batch, {micro[0].shape[0]} rows each: forward and backward "
            "loops, activations through remote buffers, gradients mean-accumulated",
            unchanged=k > 1,
        )
    return loss, list(zip(keep, kept))


def _record_accumulation(build: Build, k: int, rows: int) -> None:
    build.record(
        "accumulation",
        f"{k} micro-batches of {rows} rows: forward and backward repeated (ops.repeat), "
        "gradients mean-accumulated",
    )


def _local_step(build: Build, lowered: Lowered, named, variables, ins: Inputs, index: int) -> tuple:
    """One forward and backward call on ``named`` (the step graph's stand-ins for
    ``variables``); gradients keyed by the main graph's variables, the loss and the
    forward's outputs."""
    fwd, loss, by_local = forward_backward(build, lowered, named, ins.tensors, index)
    local_of = {named.to_dict()[name]: v for name, v in variables.to_dict().items()}
    grads = {local_of[t]: g for t, g in by_local.items() if t in local_of}
    return grads, loss, list(fwd.outputs)
