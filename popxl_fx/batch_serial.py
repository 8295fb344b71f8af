"""``Options(batch_serialisation=k)``: each (micro-)batch processed in k slices.

`serialise_step` is the transform, a function of the forward graph, its gradient graph (made by
``addons.autodiff_with_accumulation``), the step's inputs and k. It is built from addons'
``batch_serialise_fwd_and_grad`` (never a copy of it):

* each input (batch-major, ``(B, ...)``) is stored as k slices of ``B/k`` samples in a remote
  buffer, from which the serialised forward loads slice i on iteration i;
* the forward loop runs the forward graph on the k slices, one after another; every forward
  tensor the backward needs (activations, not the weights: those stay bound variables) goes to
  a remote buffer of k entries (Streaming Memory), so only one slice's activations are on chip
  at a time;
* the backward loop loads them back slice by slice and mean-accumulates the gradients into
  accumulator variables (float32: the masters' dtype); one optimizer step then reads them,
  and resetting the counter makes the next step's first slice overwrite them;
* the loss is the mean of the k slices' losses (stored per slice in a remote buffer).

Semantics: for a loss that is a mean over the batch (torch's default ``reduction="mean"``), the
loss and gradients equal the whole batch's up to the round-off of the re-ordered sums. A
``reduction="sum"`` loss gets the mean over slices (1/k of the whole batch's), as PopTorch's
mean reduction of accumulated gradients does. Layers that reduce over the batch (BatchNorm in
training mode) see one slice at a time: statistics are per slice and running statistics are
updated k times per step, in slice order (as PopTorch micro-batches).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import addons
import popxl_core as popxl
from popxl_core import ops

from .options import Options
from .precision import scaled_seed

__all__ = ["SerialStep", "check_batch", "mean_in_order", "serialise_step"]

COPY = "working_copy"  # the backward's named inputs for the working copies: "working_copy.<name>"


@dataclass
class SerialStep:
    """What `serialise_step` built: the step's loss and the accumulated gradients by arg name."""

    loss: popxl.Tensor
    grads: dict[str, popxl.Tensor]
    forward: addons.GraphWithNamedArgs  # the serialised forward loop's graph
    backward: addons.GraphWithNamedArgs  # the serialised backward loop's graph


def check_batch(inputs: Sequence[object], divisor: int, options: Options) -> int:
    """The batch size of ``inputs`` (dim 0 of every tensor, one step's); raises unless it
    divides by ``divisor`` (micro-batches x slices x replicas)."""
    k = options.batch_serialisation
    sizes = {tuple(x.shape)[:1] for x in inputs if hasattr(x, "shape")}
    if len(sizes) != 1 or sizes == {()}:
        shapes = [tuple(x.shape) for x in inputs if hasattr(x, "shape")]
        raise ValueError(
            f"Options(batch_serialisation={k}) splits every input along dim 0 (the batch), but "
            f"the inputs have shapes {shapes}; give inputs (and target) with one shared "
            "leading batch dimension."
        )
    (batch,) = sizes.pop()
    if batch % divisor:
        raise ValueError(
            f"Options(batch_serialisation={k}, gradient_accumulation="
            f"{options.gradient_accumulation}, replication_factor={options.replication_factor}): "
            f"the batch of {batch} samples does not divide by {divisor} (micro-batches x slices "
            f"x replicas); use a batch that is a multiple of {divisor}, or change the options."
        )
    return batch


def serialise_step(
    forward: addons.GraphWithNamedArgs,
    backward: addons.GraphWithNamedArgs,
    variables: addons.NamedTensors,
    accumulators: addons.NamedTensors,
    inputs: Sequence[popxl.Tensor],
    k: int,
    loss_index: int,
    loss_scale: float = 1.0,
    working_copies: Mapping[str, popxl.Tensor] | None = None,
) -> SerialStep:
    """Run ``forward`` then ``backward`` over k slices of ``inputs`` (in the current graph).

    Args:
        forward: the forward graph, traced on one slice; its positional inputs are the data.
        backward: its gradient graph from ``addons.autodiff_with_accumulation`` (the loss
            output's gradient as its only provided gradient).
        variables: the forward's variables (bound to both loops by name).
        accumulators: the backward's accumulator variables (and ``mean_accum_counter``).
        inputs: the whole batch, one main-graph tensor per positional input of ``forward``.
        k: the number of slices.
        loss_index: which output of ``forward`` is the loss.
        loss_scale: the loss's gradient (1, or ``Options.loss_scaling``).
        working_copies: variable name -> the forward's cast of that (master) variable
            (``precision="float16"``): the backward gets the cast made once in the calling
            graph, instead of a copy stored per slice like an activation.
    """
    data_ins = _data_inputs(forward)
    loads = {t: (_sliced_into_buffer(x, k), 0) for t, x in zip(data_ins, inputs)}
    loss = forward.graph.outputs[loss_index]
    loss_buffer = popxl.remote_buffer(loss.shape, loss.dtype, k)
    copies = {f"{COPY}.{n}": t for n, t in (working_copies or {}).items()}
    fwd, bwd = _loops(forward, backward, copies, k, loads, {loss: (loss_buffer, 0)})
    fwd.graph.bind(variables).call(0)
    _call_backward(backward, bwd, variables, accumulators, copies, (loss_scale, loss.dtype))
    grads = _accumulated(accumulators)
    return SerialStep(_mean_loss(loss_buffer, k), grads, fwd.graph, bwd.graph)


def _loops(forward, backward, copies: Mapping, k: int, loads: dict, stores: dict) -> tuple:
    """The forward and backward loops over the k slices: each slice loaded from its buffer
    entry, the activations the backward needs and the loss stored per slice."""
    return addons.batch_serialise_fwd_and_grad(
        forward,
        backward,
        _merged(forward.args, addons.NamedTensors.from_dict(copies)),
        k,
        load_handles=loads,
        store_streams={},
        store_buffers=stores,
        io_mode="compute",
    )


def _call_backward(
    backward: addons.GraphWithNamedArgs,
    bwd: addons.BatchSerialResult,
    variables: addons.NamedTensors,
    accumulators: addons.NamedTensors,
    copies: Mapping[str, popxl.Tensor],
    seed_value: tuple[float, popxl.dtype],
) -> None:
    """Call the serialised backward loop, seeded with the loss's gradient (the loss scale, in
    the loss's dtype), on the variables, the accumulators and the working copies cast once
    here."""
    seed_in = _grad_seed_input(backward, bwd)
    seed = scaled_seed(*seed_value)
    casts = _casts(variables, copies, bwd.graph.args.keys_flat())
    bwd.graph.bind(_merged(variables, accumulators, casts)).call(0, args={seed_in: seed})


def _accumulated(accumulators: addons.NamedTensors) -> dict[str, popxl.Tensor]:
    """The gradient sums by parameter name (``accum.<name>``)."""
    prefix = "accum."
    named = accumulators.to_dict()
    return {key[len(prefix) :]: t for key, t in named.items() if key.startswith(prefix)}


def _data_inputs(forward: addons.GraphWithNamedArgs) -> list[popxl.Tensor]:
    named = set(forward.args.tensors)
    return [t for t in forward.graph.inputs if t not in named]


def _sliced_into_buffer(x: popxl.Tensor, k: int) -> popxl.RemoteBuffer:
    """A remote buffer whose entry i holds slice i (``x[i*B/k:(i+1)*B/k]``)."""
    size = x.shape[0] // k
    buffer = popxl.remote_buffer((size, *x.shape[1:]), x.dtype, k)
    for i in range(k):
        ops.remote_store(buffer, i, ops.slice(x, start=i * size, stop=(i + 1) * size, axis=0))
    return buffer


def _grad_seed_input(
    backward: addons.GraphWithNamedArgs, serial: addons.BatchSerialResult
) -> popxl.Tensor:
    """The serialised backward's input for the loss gradient."""
    info = backward.grad_graph_info
    seeds = [
        backward.graph.inputs[i]
        for i, c in enumerate(info.expected_inputs)
        if c.connection_type.name != "Fwd"
    ]
    if len(seeds) != 1:
        raise RuntimeError(f"the gradient graph takes {len(seeds)} output gradients, not 1.")
    return serial.remap_tensors(addons.NamedTensors.from_dict({"seed": seeds[0]})).seed


def _casts(
    variables: addons.NamedTensors, copies: Mapping[str, popxl.Tensor], wanted: Sequence[str]
) -> addons.NamedTensors:
    """The working copies the backward takes, cast from their variables in this graph."""
    named = variables.to_dict()
    prefix = len(COPY) + 1
    return addons.NamedTensors.from_dict(
        {k: ops.cast(named[k[prefix:]], copies[k].dtype) for k in copies if k in wanted}
    )


def _merged(*trees: addons.NamedTensors) -> addons.NamedTensors:
    merged: dict[str, popxl.Tensor] = {}
    for tree in trees:
        merged.update(tree.to_dict())
    return addons.NamedTensors.from_dict(merged)


def _mean_loss(buffer: popxl.RemoteBuffer, k: int) -> popxl.Tensor:
    """The mean of the k slices' losses, summed in slice order (each loaded as it is added)."""
    return mean_in_order(ops.remote_load(buffer, i, f"loss.{i}") for i in range(k))


def mean_in_order(values: Iterable[popxl.Tensor]) -> popxl.Tensor:
    """The mean of ``values``, summed left to right (a generator's values are made as they
    are added, so their ops interleave with the sums)."""
    it = iter(values)
    total, n = next(it), 1
    for v in it:
        total, n = total + v, n + 1
    return total / popxl.constant(float(n), total.dtype) if n > 1 else total
