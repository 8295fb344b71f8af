"""The training step's loops: micro-batches (`gradient_accumulation`) and device iterations.

Both are `ops.repeat` of a subgraph built by `lifted_graph`: the subgraph's code is written as
if it ran in the calling graph, and every tensor of the caller it uses (variables, the loaded
batch) becomes an input passed by reference, so in-place updates (parameters, optimizer state,
batch-norm statistics, gradient accumulators) reach the caller's variables.

- `micro_batch_loop`: the step's batch (B rows) is cut into k consecutive micro-batches of
  B/k rows (`ops.dynamic_slice` at a carried offset); each runs the forward and the gradient
  graph of `addons.autodiff_with_accumulation`, which mean-accumulates the parameter
  gradients in ``accum.*`` variables. The loss returned is the sum of the k micro-batch losses
  divided by k (for a mean loss, eager's full-batch mean up to float32 round-off).
- the device-iteration loop (`repeat_step`): the whole step (inputs loaded, forward,
  backward, optimizer, loss stored) repeated n times per call, ``ir.num_host_transfers = n``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import addons
import popxl_core as popxl
from popxl_core import ops

from .precision import scaled_seed

__all__ = ["check_batches", "lifted_graph", "micro_batch_loop", "repeat_step"]

Local = Callable[[popxl.Tensor], popxl.Tensor]


def lifted_graph(
    ir: popxl.Ir, name: str, body: Callable[..., Any], carried: Sequence[popxl.TensorSpec] = ()
) -> tuple[popxl.Graph, list[popxl.Tensor]]:
    """A subgraph made by ``body(local, *carried)``, and the caller's tensors it reads.

    ``local(t)`` is the subgraph's input standing for the caller's tensor ``t`` (made on first
    use, by reference). The graph's inputs are ``carried`` first (what `ops.repeat` feeds back
    from its outputs), then one per caller tensor, in the order of the returned list.
    """
    outer: list[popxl.Tensor] = []
    inner: dict[popxl.Tensor, popxl.Tensor] = {}

    def local(t: popxl.Tensor) -> popxl.Tensor:
        if t not in inner:
            inner[t] = popxl.graph_input(t.shape, t.dtype, _input_name(t), by_ref=True)
            outer.append(t)
        return inner[t]

    def traced(*args: popxl.Tensor) -> Any:
        return body(local, *args)

    traced.__qualname__ = traced.__name__ = name  # the graph's name: "<name>_subgraph(N)"

    return ir.create_graph(traced, *carried), outer


def _input_name(t: popxl.Tensor) -> str:
    return t.name.replace("/", ".")


def _named(tensors: addons.NamedTensors, local: Local) -> addons.NamedTensors:
    return addons.NamedTensors.from_dict({n: local(t) for n, t in tensors.to_dict().items()})


def micro_batch_loop(
    ir: popxl.Ir,
    fwd: addons.GraphWithNamedArgs,
    bwd: addons.GraphWithNamedArgs,
    variables: addons.NamedTensors,
    accum: addons.NamedTensors,
    batch: Sequence[popxl.Tensor],
    k: int,
    loss_index: int,
    micro_step: Callable[..., popxl.Tensor] | None = None,
    loss_scale: float = 1.0,
    keep: Sequence[int] = (),
) -> tuple[popxl.Tensor, list[popxl.Tensor]]:
    """Forward and accumulating backward over ``k`` micro-batches of ``batch`` (in the current
    graph: `ops.repeat` of one micro-batch graph); returns the mean of the k losses and, for
    each forward output index in ``keep``, its k values (``[k, ...]``, one per micro-batch).

    ``micro_step(variables, accum, xs) -> loss`` replaces the forward and backward call of one
    micro-batch (batch serialisation: its slices; ``keep`` must then be empty); ``loss_scale``
    seeds the backward."""
    rows = batch[0].shape[0] // k
    loss_dtype = fwd.graph.outputs[loss_index].dtype
    kept_specs = _kept_specs([fwd.graph.outputs[i] for i in keep], k)

    def one_micro_batch(local: Local, offset, loss_sum, *rest: popxl.Tensor):
        xs = [ops.dynamic_slice(local(x), offset, [0], [rows], True) for x in batch]
        if micro_step is not None:
            loss = micro_step(_named(variables, local), _named(accum, local), xs)
            outs: Sequence[popxl.Tensor] = [loss]
        else:
            site = fwd.bind(_named(variables, local)).call_with_info(*xs)
            outs, loss = site.outputs, site.outputs[loss_index]
            seed = scaled_seed(loss_scale, loss.dtype)
            bwd.bind(_named(accum, local)).call(seed, args=bwd.grad_graph_info.inputs_dict(site))
        step = popxl.constant(np.array([rows], np.uint32), popxl.uint32, "rows")
        return offset + step, loss_sum + loss, *_kept_next(rest, [outs[i] for i in keep])

    index = popxl.TensorSpec((1,), popxl.uint32)
    carried = [index, popxl.TensorSpec((), loss_dtype), *kept_specs]
    graph, outer = lifted_graph(ir, "micro_batch", one_micro_batch, carried)
    start = popxl.constant(np.zeros(1, np.uint32), popxl.uint32, "offset")
    zero = popxl.constant(0.0, loss_dtype, "loss_sum")
    _, loss_sum, *kept = ops.repeat(graph, k, start, zero, *_kept_start(kept_specs), *outer)
    return loss_sum / popxl.constant(float(k), loss_dtype, "micro_batches"), kept[1:]


def _kept_specs(outputs: Sequence[popxl.Tensor], k: int) -> list[popxl.TensorSpec]:
    """What the micro-batch loop carries for the outputs it keeps: the micro-batch's place,
    then each output's ``[k, ...]`` values (nothing when none is kept)."""
    if not outputs:
        return []
    stacks = [popxl.TensorSpec((k, *t.shape), t.dtype) for t in outputs]
    return [popxl.TensorSpec((1,), popxl.uint32), *stacks]


def _kept_start(specs: Sequence[popxl.TensorSpec]) -> list[popxl.Tensor]:
    """The carried place (0) and zeroed stacks before the first micro-batch."""
    if not specs:
        return []
    first = popxl.constant(np.zeros(1, np.uint32), popxl.uint32, "micro_batch")
    return [first, *(ops.init(t.shape, t.dtype, f"micro_batch_output{i}") for i, t in
                     enumerate(specs[1:]))]  # fmt: skip


def _kept_next(carried: Sequence[popxl.Tensor], outs: Sequence[popxl.Tensor]) -> list:
    """After a micro-batch: the next place and the stacks with its ``outs`` written in."""
    if not outs:
        return []
    at, one = carried[0], popxl.constant(np.array([1], np.uint32), popxl.uint32, "one")
    return [at + one, *(_put(t, at, v) for t, v in zip(carried[1:], outs))]


def _put(stack: popxl.Tensor, at: popxl.Tensor, value: popxl.Tensor) -> popxl.Tensor:
    """``stack`` with ``value`` written at row ``at`` of its first dimension."""
    one = value.reshape((1, *value.shape))
    return ops.dynamic_update(stack, at, one, [0], [1], True)


def repeat_step(ir: popxl.Ir, n: int, step: Callable[[Local], None]) -> popxl.Graph:
    """``step(local)`` built as one graph and repeated ``n`` times in the current graph."""
    graph, outer = lifted_graph(ir, "step", step)
    ops.repeat(graph, n, *outer)
    return graph


def check_batches(inputs: Sequence[Any], k: int, n: int) -> None:
    """Every input's leading dimension is the device-iteration count ``n`` (when n > 1) and
    the batch dimension after it divides by ``k``; otherwise a ValueError naming the option,
    the sizes and the fix."""
    for i, x in enumerate(inputs):
        shape = tuple(x.shape)
        if n > 1 and (not shape or shape[0] != n):
            raise ValueError(
                f"Options(device_iterations={n}): input {i} has shape {shape}, but each input "
                f"needs a leading dimension of {n} (one batch per iteration, as PopTorch's "
                f"deviceIterations); stack {n} batches: torch.stack([batch] * ...) of shape "
                f"({n}, batch, ...)."
            )
        step_shape = shape[1:] if n > 1 else shape
        if k > 1 and (not step_shape or step_shape[0] % k):
            size = step_shape[0] if step_shape else "no batch dimension"
            raise ValueError(
                f"Options(gradient_accumulation={k}): input {i} has batch size {size} (shape "
                f"{shape}), which does not split into {k} micro-batches; use a batch size that "
                f"is a multiple of {k}, or a gradient_accumulation that divides {size}."
            )
