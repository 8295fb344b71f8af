"""Fits the machine model's two fixed costs to Graphcore's published wall times.

A cycle model built from FLOPs alone is about 1000x optimistic for small networks
(ipu_model.md §2): a step's time is dominated by fixed costs. The model has two, each in
`Machine`: ``run_overhead_s`` (one ``Session.run``: the host round trip and program launch) and
``host_latency_s`` (one host stream transfer, on top of bytes / bandwidth). They are fitted to
the two figures recorded by Graphcore's PopXL tutorial "remote variables and RTS" [S14] for the
784-512-512-512-10 MNIST MLP on a Mk2 IPU:

* training, 4 replicas x gradient accumulation 4 x micro-batch 8 = 128 samples per step, Adam:
  **3.37 ms per step**;
* inference at batch 80 on one replica: **0.80 ms per step**.

Each figure is rebuilt here as a program of this project's own (`training_ir`,
`inference_ir`): each step's time is (estimate without the fixed costs) + run overhead + host
transfers x latency, two linear equations in two unknowns. The training program keeps weights
and Adam state in Streaming Memory as RTS shards and moves them with real ops (remote loads
and stores of the shards, the all-gather of the weights, the reduce-scatter of the
gradients), which the planner costs like any other program's: bytes / Streaming-Memory or
IPU-Link bandwidth plus one sync each. A Streaming-Memory latency is not fitted: two figures
pin down two constants, and only the training figure has remote traffic.

The result is an **estimate**: two fixed costs fitted to two figures of one network; it says
nothing measured about other programs (see `check`).

Example:
    >>> fit().host_latency_s > 0
    True
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .. import ops, transforms
from ..context import in_sequence
from ..dtypes import float16, float32, int32
from ..ir import Ir
from ..ops import collectives
from ..ops.io import HOST_LOAD, HOST_STORE
from ..remote_buffer import replica_sharded_buffer
from ..remote_variables import remote_replica_sharded_variable
from ..streams import d2h_stream, h2d_stream
from ..tensor import Tensor, TensorByRef, TensorSpec, variable
from .machine import MK2, Machine
from .plan import Plan, build_plan

__all__ = [
    "PUBLISHED_S",
    "SOURCE",
    "Calibration",
    "check",
    "fit",
    "inference_ir",
    "training_ir",
]

LAYERS = (784, 512, 512, 512, 10)
PUBLISHED_S = {"training": 3.37e-3, "inference": 0.80e-3}
SOURCE = (
    "graphcore/examples tutorials/popxl/5_remote_variables_and_rts, recorded outputs "
    "(ipu_model.md §2, [S14])"
)
TRAIN = {"replicas": 4, "accumulation": 4, "micro_batch": 8}
INFER_BATCH = 80
_HOST_OPS = (HOST_LOAD.name, HOST_STORE.name)


def _mlp(x, *params):
    """784-512-512-512-10: ``x @ w + b`` per layer, gelu on all but the last."""
    x = x.reshape((x.shape[0], -1))
    for i in range(0, len(params), 2):
        x = x @ params[i] + params[i + 1]
        if i + 2 < len(params):
            x = ops.gelu(x)
    return x


def _param_specs() -> list[TensorSpec]:
    specs = []
    for n_in, n_out in zip(LAYERS, LAYERS[1:]):
        specs += [TensorSpec((n_in, n_out), float32), TensorSpec((n_out,), float32)]
    return specs


def _variables(specs, prefix: str = "", dtype=None):
    return [
        variable(np.zeros(s.shape, (dtype or s.dtype).as_numpy()), name=f"{prefix}p{i}")
        for i, s in enumerate(specs)
    ]


def inference_ir(batch: int = INFER_BATCH) -> Ir:
    """The tutorial's test program: load images, forward, store the logits."""
    ir = Ir()
    with ir.main_graph:
        images = h2d_stream((batch, 28, 28), float32, "image")
        x = ops.host_load(images)
        params = _variables(_param_specs())
        forward = ir.create_graph(_mlp, x, *params)
        (logits,) = ops.call(forward, x, *params)
        ops.host_store(d2h_stream(logits.shape, logits.dtype, "outputs"), logits)
    return ir


def training_ir(micro_batch: int = 8, accumulation: int = 4, replicas: int = 4) -> Ir:
    """The tutorial's training step: weights and Adam state (first order float16, second order
    float32) in Streaming Memory as RTS shards of ``ceil(n/replicas)`` elements. Load the weight
    shards and all-gather them; a repeat of ``accumulation`` micro-batches (load, forward,
    loss, backward, accumulate, store the loss); reduce-scatter the accumulated gradients
    (mean over the replicas); load the Adam state shards, update the weight shards and store
    weights and state back; zero the accumulators."""
    ir = Ir(replication=replicas)
    ir.num_host_transfers = accumulation
    specs = _param_specs()
    with ir.main_graph, in_sequence(True):
        images = h2d_stream((micro_batch, 28 * 28), float32, "image")
        labels = h2d_stream((micro_batch,), int32, "labels")
        losses = d2h_stream((), float32, "loss")
        homes = [_remote_shards(s, float32, f"p{i}") for i, s in enumerate(specs)]
        shards = [ops.remote_load(buf, 0) for buf in homes]
        params = [collectives.replicated_all_gather(w, output_shape="meta_shape") for w in shards]
        accums = _variables(specs, "accum_")
        forward = ir.create_graph(_mlp, TensorSpec((micro_batch, 28 * 28), float32), *specs)
        backward = transforms.autodiff(forward, grads_required=forward.inputs[1:])

        def micro_step(ws: list, accs: TensorByRef):  # type: ignore[valid-type]  # as PopXL
            x, y = ops.host_load(images), ops.host_load(labels)
            fwd = ops.call_with_info(forward, x, *ws)
            probs = ops.softmax(fwd.outputs[0], axis=-1)
            loss, dlogits = ops.nll_loss_with_softmax_grad(probs, y)
            bwd = ops.call_with_info(backward.graph, dlogits, inputs_dict=backward.inputs_dict(fwd))
            grads = backward.fwd_parent_ins_to_grad_parent_outs(fwd, bwd)
            acc: Tensor  # one of ``accs`` (by-ref tensors, typed with PopXL's marker)
            for w, acc in zip(ws, accs):
                ops.var_updates.accumulate_(acc, grads[w])
            ops.host_store(losses, loss)

        ops.repeat(ir.create_graph(micro_step, specs, specs), accumulation, *params, *accums)
        _adam(homes, shards, accums, specs)
    return ir


def _remote_shards(spec: TensorSpec, dtype, name: str):
    """A replica-sharded remote buffer holding one zero variable of ``spec``'s shape."""
    buf = replica_sharded_buffer(spec.shape, dtype)
    remote_replica_sharded_variable(np.zeros(spec.shape, dtype.as_numpy()), buf, 0, name=name)
    return buf


def _adam(homes, shards, accums, specs) -> None:
    """Adam on this replica's shards of weights, state and mean gradients; store them back."""
    for i, (home, w, acc, spec) in enumerate(zip(homes, shards, accums, specs)):
        g = collectives.replicated_reduce_scatter(
            acc, "mean", configure_output_for_replicated_tensor_sharding=True
        )
        bufs = (
            _remote_shards(spec, float16, f"first_{i}"),
            _remote_shards(spec, float32, f"second_{i}"),
        )
        m, v = (ops.remote_load(b, 0) for b in bufs)
        ops.var_updates.accumulate_moving_average_(m, ops.cast(g, float16), 0.9)
        ops.var_updates.accumulate_moving_average_square_(v, g, 0.999)
        update = ops.var_updates.adam_updater(m, v, epsilon=1e-5)
        ops.scaled_add_(w, update, b=-1e-3)
        for buf, t in ((home, w), *zip(bufs, (m, v))):
            ops.remote_store(buf, 0, t)
        ops.var_updates.accumulator_zero_(acc)


@dataclass
class Calibration:
    """The fitted fixed costs and, per figure, the estimate they give."""

    run_overhead_s: float
    host_latency_s: float
    estimates_s: dict[str, float]

    def errors(self) -> dict[str, float]:
        """Relative error of each estimate against its published figure."""
        return {k: self.estimates_s[k] / PUBLISHED_S[k] - 1 for k in PUBLISHED_S}


def _host_transfers(plan: Plan) -> int:
    return sum(r.runs for r in plan.ops if r.op.split(".")[0] in _HOST_OPS)


def _plans(machine: Machine) -> dict[str, Plan]:
    """Each figure's plan on ``machine``."""
    return {
        "training": build_plan(training_ir(**TRAIN), machine),
        "inference": build_plan(inference_ir(), machine),
    }


def fit(machine: Machine = MK2) -> Calibration:
    """Solve for run overhead and host latency so both figures are met exactly."""
    bare = replace(machine, run_overhead_s=0.0, host_latency_s=0.0)
    rows, rhs = [], []
    for name, plan in _plans(bare).items():
        rows.append([1.0, _host_transfers(plan)])
        rhs.append(PUBLISHED_S[name] - plan.seconds)
    overhead, latency = np.linalg.solve(np.array(rows), np.array(rhs))
    tuned = replace(machine, run_overhead_s=float(overhead), host_latency_s=float(latency))
    return Calibration(float(overhead), float(latency), check(tuned))


def check(machine: Machine = MK2) -> dict[str, float]:
    """The estimate, in seconds per step, of each published figure on ``machine``."""
    return {name: plan.seconds for name, plan in _plans(machine).items()}
