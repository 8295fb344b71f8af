"""The fixed costs in the machine table are the fit to Graphcore's published MNIST timings.

Published (ipu_model.md §2, tutorial "remote variables and RTS"): training 3.37 ms per step
(4 replicas x accumulation 4 x micro-batch 8), inference at batch 80 0.80 ms per step. The
training program keeps weights and Adam state in Streaming Memory as RTS shards, moved by
real remote loads/stores and collectives.
"""

from dataclasses import replace

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core import ops, transforms
from popxl_core.sim import calibration
from popxl_core.sim.machine import BOW, MK2
from popxl_core.sim.plan import build_plan


@pytest.fixture(scope="module")
def fitted():
    return calibration.fit(MK2)


def test_the_fit_meets_both_figures_with_positive_costs(fitted):
    assert fitted.run_overhead_s > 0 and fitted.host_latency_s > 0
    # two unknowns, two equations: exact up to the ceil() of each op's cycles
    assert max(abs(e) for e in fitted.errors().values()) < 1e-4


def test_machine_table_holds_the_fitted_constants_rounded(fitted):
    # the table rounds to 1 us: within 0.5 us of the fit
    assert MK2.run_overhead_s == pytest.approx(fitted.run_overhead_s, abs=0.5e-6)
    assert MK2.host_latency_s == pytest.approx(fitted.host_latency_s, abs=0.5e-6)
    assert BOW.run_overhead_s == MK2.run_overhead_s  # host-side costs, in seconds


def test_estimates_are_within_10_percent_of_the_published_figures():
    estimates = calibration.check(MK2)
    for name, published in calibration.PUBLISHED_S.items():
        assert estimates[name] == pytest.approx(published, rel=0.10), name
    # and well within: the table's rounding moves each by under 0.5 %
    assert estimates["inference"] == pytest.approx(0.80e-3, rel=0.005)
    assert estimates["training"] == pytest.approx(3.37e-3, rel=0.005)


def test_fixed_costs_dominate_the_small_mlp_as_published():
    bare = replace(MK2, run_overhead_s=0.0, host_latency_s=0.0)
    flops_only = calibration.check(bare)["inference"]
    assert flops_only < 0.1 * calibration.PUBLISHED_S["inference"]


def test_training_program_moves_rts_shards_through_streaming_memory():
    plan = build_plan(calibration.training_ir(**calibration.TRAIN), MK2)
    sizes = _param_sizes()
    assert sum(sizes) == 932_362  # the golden Ψ of ipu_model.md §4
    shard_bytes = sum(-(-n // 4) for n in sizes) * (4 + 2 + 4)  # weight, first, second order
    work = plan.work
    assert work.remote_bytes_loaded == work.remote_bytes_stored == shard_bytes
    assert plan.streaming_memory_bytes == shard_bytes
    # all-gather of each weight + reduce-scatter of each gradient: (R-1)/R of it each
    assert work.link_bytes == sum(2 * -(-3 * n * 4 // 4) for n in sizes)
    assert plan.memory[0].variables == 4 * sum(sizes)  # only the accumulators stay on chip


def _param_sizes():
    layers = calibration.LAYERS
    sizes = []
    for a, b in zip(layers, layers[1:]):
        sizes += [a * b, b]
    return sizes


def test_rts_shards_follow_the_padding_rule():
    from popxl_core.sim.cost import rts_shard

    # [5, 2, 3] over 4 replicas: 8, 8, 7 + pad, 7 + pad (ipu_model.md §4)
    assert rts_shard(30, 4) == 8 and 4 * rts_shard(30, 4) - 30 == 2
    assert rts_shard(32, 4) == 8 and rts_shard(1, 4) == 1 and rts_shard(7, 1) == 7
    with pytest.raises(ValueError, match="replicas must be >= 1, got 0"):
        rts_shard(4, 0)


def _onchip_training_ir():
    """The reference: one replica, weights and Adam state on chip, the same steps."""
    ir = popxl.Ir()
    ir.num_host_transfers = 4
    specs = calibration._param_specs()
    with ir.main_graph, popxl.in_sequence(True):
        images = popxl.h2d_stream((8, 784), popxl.float32, "image")
        labels = popxl.h2d_stream((8,), popxl.int32, "labels")
        losses = popxl.d2h_stream((), popxl.float32, "loss")
        params = calibration._variables(specs)
        accums = calibration._variables(specs, "accum_")
        forward = ir.create_graph(
            calibration._mlp, popxl.TensorSpec((8, 784), popxl.float32), *specs
        )
        backward = transforms.autodiff(forward, grads_required=forward.inputs[1:])

        def micro_step(ws, accs: popxl.TensorByRef):
            fwd = ops.call_with_info(forward, ops.host_load(images), *ws)
            loss, dlogits = ops.nll_loss_with_softmax_grad(
                ops.softmax(fwd.outputs[0], axis=-1), ops.host_load(labels)
            )
            bwd = ops.call_with_info(backward.graph, dlogits, inputs_dict=backward.inputs_dict(fwd))
            grads = backward.fwd_parent_ins_to_grad_parent_outs(fwd, bwd)
            for w, acc in zip(ws, accs):
                ops.var_updates.accumulate_(acc, grads[w])
            ops.host_store(losses, loss)

        ops.repeat(ir.create_graph(micro_step, specs, specs), 4, *params, *accums)
        first = calibration._variables(specs, "first_", popxl.float16)
        second = calibration._variables(specs, "second_")
        for w, g, m, v in zip(params, accums, first, second):
            ops.var_updates.accumulate_moving_average_(m, ops.cast(g, popxl.float16), 0.9)
            ops.var_updates.accumulate_moving_average_square_(v, g, 0.999)
            ops.scaled_add_(w, ops.var_updates.adam_updater(m, v, epsilon=1e-5), b=-1e-3)
    return ir


def _one_step(ir, replicas: int, rng_seed: int = 0):
    """Random weights, one step on the same 4 micro-batches on every replica; the weights."""
    rng = np.random.default_rng(rng_seed)
    names = [f"p{i}" for i in range(8)]
    found = {v.name: v for v in ir.main_graph.variables}
    params = [found[n] for n in names]
    session = popxl.Session(ir, "ipu_hw")
    session.write_variables_data(
        {v: rng.normal(0, 0.05, v.shape).astype(np.float32) for v in params}
    )
    x = rng.uniform(0, 1, (4, 8, 784)).astype(np.float32)
    y = rng.integers(0, 10, (4, 8)).astype(np.int32)
    if replicas > 1:  # (transfers, replicas, ...): every replica sees the same batch
        x, y = (np.stack([a] * replicas, 1) for a in (x, y))
    streams = sorted(ir.get_all_h2d_streams(), key=lambda s: s.tensor_id)  # image, labels
    with session:
        session.run(dict(zip(streams, (x, y))))
        data = session.get_tensors_data(params)
    return [data[v] for v in params]


def test_training_program_steps_like_the_on_chip_program():
    # 4 replicas on the same data: the mean of 4 equal gradients is that gradient, so the RTS
    # step equals the one-replica on-chip step up to the float32 rounding of that mean, which
    # is deterministic and measured 0 here: bit-identical weights
    rts = _one_step(calibration.training_ir(**calibration.TRAIN), 4)
    ref = _one_step(_onchip_training_ir(), 1)
    moved = [np.abs(a - b).max() for a, b in zip(rts, _start_weights())]
    assert min(moved) > 0  # the step did update every weight
    for a, b in zip(rts, ref):
        np.testing.assert_array_equal(a, b)


def _start_weights():
    rng = np.random.default_rng(0)
    return [rng.normal(0, 0.05, s.shape).astype(np.float32) for s in calibration._param_specs()]
