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
transfers x latency, two linear equations in two unknowns. The tutorial keeps weights and Adam
state in Streaming Memory, sharded over the replicas (RTS). Until remote buffers and
collectives land in popxl_core, `streaming_memory_work` adds what they cost (remote loads and
stores of the shards, the all-gather of the weights and the reduce-scatter of the gradients)
with the same formulas the planner uses for those ops; the program itself keeps them on chip.
Once they land, `training_ir` should use them and this term goes.

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
from ..dtypes import float16, float32, int32
from ..ir import Ir
from ..streams import d2h_stream, h2d_stream
from ..tensor import TensorByRef, TensorSpec, variable
from .cost import CostModel, Work, rts_shard
from .machine import MK2, Machine
from .plan import Plan, build_plan

__all__ = [
    "PUBLISHED_S",
    "SOURCE",
    "Calibration",
    "check",
    "fit",
    "inference_ir",
    "streaming_memory_work",
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
_HOST_OPS = ("HostLoad", "HostStore")


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
    """The tutorial's training step with its Streaming-Memory parts kept on chip: a repeat of
    ``accumulation`` micro-batches (load, forward, loss, backward, accumulate, store the loss),
    then Adam (first order float16, second order float32) and zeroed accumulators."""
    ir = Ir(replication=replicas)
    ir.num_host_transfers = accumulation
    specs = _param_specs()
    with ir.main_graph:
        images = h2d_stream((micro_batch, 28 * 28), float32, "image")
        labels = h2d_stream((micro_batch,), int32, "labels")
        losses = d2h_stream((), float32, "loss")
        params = _variables(specs)
        accums = _variables(specs, "accum_")
        forward = ir.create_graph(_mlp, TensorSpec((micro_batch, 28 * 28), float32), *specs)
        backward = transforms.autodiff(forward, grads_required=forward.inputs[1:])

        def micro_step(ws: list, accs: TensorByRef):
            x, y = ops.host_load(images), ops.host_load(labels)
            fwd = ops.call_with_info(forward, x, *ws)
            probs = ops.softmax(fwd.outputs[0], axis=-1)
            loss, dlogits = ops.nll_loss_with_softmax_grad(probs, y)
            bwd = ops.call_with_info(backward.graph, dlogits, inputs_dict=backward.inputs_dict(fwd))
            grads = backward.fwd_parent_ins_to_grad_parent_outs(fwd, bwd)
            for w, acc in zip(ws, accs):
                ops.var_updates.accumulate_(acc, grads[w])
            ops.host_store(losses, loss)

        ops.repeat(ir.create_graph(micro_step, specs, specs), accumulation, *params, *accums)
        _adam(params, accums, specs)
    return ir


def _adam(params, accums, specs) -> None:
    first = _variables(specs, "first_", float16)
    second = _variables(specs, "second_")
    for w, g, m, v in zip(params, accums, first, second):
        ops.var_updates.accumulate_moving_average_(m, ops.cast(g, float16), 0.9)
        ops.var_updates.accumulate_moving_average_square_(v, g, 0.999)
        update = ops.var_updates.adam_updater(m, v, epsilon=1e-5)
        ops.scaled_add_(w, update, b=-1e-3)
        ops.var_updates.accumulator_zero_(g)


def streaming_memory_work(machine: Machine, replicas: int = 4) -> Work:
    """What the tutorial's remote, RTS-sharded state costs per step and replica: for every
    parameter (n elements), load and store the ``ceil(n/R)`` shards of the weight (float32),
    first order (float16) and second order (float32); all-gather the weight and
    reduce-scatter its gradient (float32) over the ring."""
    model = CostModel(machine, num_ipus=replicas, replicas=replicas)
    parts = []
    for spec in _param_specs():
        n = int(np.prod(spec.shape))
        shard = rts_shard(n, replicas)
        for itemsize in (4, 2, 4):
            parts += [
                model.remote_work(shard * itemsize, stored=False),
                model.remote_work(shard * itemsize, stored=True),
            ]
        parts += [model.ring_work(n * 4, 1.0), model.ring_work(n * 4, 1.0)]
    return Work.total_of(parts)


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


def _plans(machine: Machine) -> dict[str, tuple[Plan, float]]:
    """Each figure's plan on ``machine`` and the seconds its off-chip state adds."""
    sm = streaming_memory_work(machine, TRAIN["replicas"]).cycles.total / machine.clock_hz
    return {
        "training": (build_plan(training_ir(**TRAIN), machine), sm),
        "inference": (build_plan(inference_ir(), machine), 0.0),
    }


def fit(machine: Machine = MK2) -> Calibration:
    """Solve for run overhead and host latency so both figures are met exactly."""
    bare = replace(machine, run_overhead_s=0.0, host_latency_s=0.0)
    rows, rhs = [], []
    for name, (plan, extra) in _plans(bare).items():
        rows.append([1.0, _host_transfers(plan)])
        rhs.append(PUBLISHED_S[name] - plan.seconds - extra)
    overhead, latency = np.linalg.solve(np.array(rows), np.array(rhs))
    tuned = replace(machine, run_overhead_s=float(overhead), host_latency_s=float(latency))
    return Calibration(float(overhead), float(latency), check(tuned))


def check(machine: Machine = MK2) -> dict[str, float]:
    """The estimate, in seconds per step, of each published figure on ``machine``."""
    return {name: plan.seconds + extra for name, (plan, extra) in _plans(machine).items()}
