"""Golden memory arithmetic of RTS and phasing (ipu_model.md §4), read from the SimReport.

* RTS over R replicas stores ``ceil(n / R)`` elements of an n-element tensor per replica (the
  last shards zero-padded): the report's per-IPU variable bytes are the sum of those shards.
* Phasing keeps each layer's variables in Streaming Memory and loads them for its phase only:
  the most variable bytes on chip at once drop from the sum over the layers to the largest
  phase's (for the 784-512-512-512-10 MLP, fc1's 784 x 512 + 512 float32 = 1,607,680 B).
"""

from __future__ import annotations

import sys
from math import ceil, prod
from pathlib import Path

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core import ops
from popxl_core.ops import collectives as coll
from popxl_core.sim.machine import MK2
from popxl_core.sim.plan import build_plan

ROOT = Path(__file__).resolve().parents[1]
LAYERS = (784, 512, 512, 512, 10)
# the seed MLP's weights and biases, and the [5, 2, 3] example of PopXL's RTS docs
SHAPES = [s for a, b in zip(LAYERS, LAYERS[1:]) for s in ((a, b), (b,))] + [(5, 2, 3)]
PSI = 932_362  # parameters of the MLP (ipu_model.md §4)


def _state_ir(replicas: int, sharded: bool):
    """Weights on chip (RTS shards when ``sharded``) and Adam's first (float16) and second
    (float32) order in Streaming Memory (RTS shards when ``sharded``), each loaded, used and
    stored back in turn."""
    ir = popxl.Ir(replication=replicas)
    with ir.main_graph, popxl.in_sequence(True):
        total = popxl.constant(np.float32(0))
        for i, shape in enumerate(SHAPES):
            ones = np.ones(shape, np.float32)
            if sharded:
                _, w = popxl.replica_sharded_variable(ones, name=f"w{i}")
            else:
                w = popxl.variable(ones, name=f"w{i}")
            total = total + ops.sum(w)
            for dtype in (popxl.float16, popxl.float32):
                buf = (
                    popxl.replica_sharded_buffer(shape, dtype)
                    if sharded
                    else popxl.remote_buffer(shape, dtype)
                )
                make = popxl.remote_replica_sharded_variable if sharded else popxl.remote_variable
                make(ones.astype(dtype.as_numpy()), buf, 0, name=f"m{i}_{dtype.name}")
                state = ops.remote_load(buf, 0)
                ops.remote_store(buf, 0, state + 1.0)
        ops.host_store(popxl.d2h_stream((), popxl.float32, "total"), total)
    return ir


def _shard_bytes(replicas: int, itemsize: int) -> int:
    return sum(ceil(prod(s) / replicas) * itemsize for s in SHAPES)


def test_rts_over_4_replicas_divides_the_sharded_state_by_4_with_ceil_padding():
    full_report = build_plan(_state_ir(4, sharded=False), MK2).report()
    rts_report = build_plan(_state_ir(4, sharded=True), MK2).report()
    full, rts = full_report.to_dict(), rts_report.to_dict()
    n = [prod(s) for s in SHAPES]
    assert sum(n[:-1]) == PSI and n[-1] == 30
    # per replica: ceil(n / 4) elements; 10 -> 3 (+2 pad), 30 -> 8 (8, 8, 7+1, 7+1)
    shards = [ceil(k / 4) for k in n]
    assert shards[-3:] == [1280, 3, 8]
    assert full["memory"]["0"]["variables"] == 4 * sum(n) == 3_729_568
    assert rts["memory"]["0"]["variables"] == 4 * sum(shards) == 932_396
    assert rts["variable_bytes"] == _shard_bytes(4, 4)
    # Streaming Memory per replica: each remote buffer entry holds one shard (a replica-
    # sharded weight keeps its home there too, besides its on-chip shard)
    assert full["streaming_memory_bytes"] == (2 + 4) * sum(n)
    assert rts["streaming_memory_bytes"] == _shard_bytes(4, 2) + 2 * _shard_bytes(4, 4)
    # one state tensor is loaded at a time: the largest (fc1's float32 second order)
    assert full["loaded_variable_peak_bytes"] == 784 * 512 * 4
    assert rts["loaded_variable_peak_bytes"] == 784 * 512  # its shard: 4 x 100,352 B
    assert rts["variables_on_chip_peak_bytes"] == 932_396 + 784 * 512
    # 4 x the shards is the state plus the padding (2 + 2 elements): not quite 4x smaller
    assert 4 * sum(shards) - sum(n) == 2 + 2
    diff = full_report.diff(rts_report, ("full", "rts"))
    assert diff["variable_bytes"] == (3_729_568, 932_396)


def test_rts_peak_counts_the_gathered_full_tensor_while_it_lives():
    ir = popxl.Ir(replication=4)
    with ir.main_graph, popxl.in_sequence(True):
        buf = popxl.replica_sharded_buffer((5, 2, 3), popxl.float32)
        popxl.remote_replica_sharded_variable(np.ones((5, 2, 3), np.float32), buf, 0, name="w")
        full = coll.replicated_all_gather(ops.remote_load(buf, 0), output_shape="meta_shape")
        ops.host_store(popxl.d2h_stream((5, 2, 3), popxl.float32, "w"), full * 2.0)
    data = popxl.Session(ir, "ipu_hw").report.to_dict()
    assert data["streaming_memory_bytes"] == 8 * 4  # ceil(30 / 4) float32 per replica
    assert data["loaded_variable_peak_bytes"] == 8 * 4 + 30 * 4  # the shard and the gather


def _remote_layers(concurrent: bool):
    """Two remote variables used one after the other, or both at once."""
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence(True):
        bufs = [popxl.remote_buffer((64, 64), popxl.float32) for _ in range(2)]
        for i, b in enumerate(bufs):
            popxl.remote_variable(np.eye(64, dtype=np.float32), b, 0, name=f"w{i}")
        x = ops.host_load(popxl.h2d_stream((4, 64), popxl.float32, "x"))
        if concurrent:
            w0, w1 = (ops.remote_load(b, 0) for b in bufs)
            x = x @ w0 @ w1
        else:
            for b in bufs:
                x = x @ ops.remote_load(b, 0)
        ops.host_store(popxl.d2h_stream((4, 64), popxl.float32, "y"), x)
    return ir


@pytest.mark.parametrize("concurrent", [False, True])
def test_loaded_variables_peak_is_the_max_of_phases_or_the_sum_of_overlaps(concurrent):
    session = popxl.Session(_remote_layers(concurrent), "ipu_hw")
    mem = session.plan.memory[0]
    layer = 64 * 64 * 4
    assert mem.variables == 0 and mem.loaded_variables == (2 if concurrent else 1) * layer
    assert mem.activations >= mem.loaded_variables  # they are part of the liveness
    report = session.report
    main = report.loaded_variables(0, expand=False)
    assert max(b for _, b in main) == mem.loaded_variables
    assert [b for _, b in main] == report.to_dict()["loaded_variables"]["0"]
    assert len(report.loaded_variables(0)) == len(report.liveness(0))
    x = np.arange(256, dtype=np.float32).reshape(4, 64)
    with session:
        out = next(iter(session.run({session.ir.get_all_h2d_streams().pop(): x}).values()))
    np.testing.assert_array_equal(out, x)  # identity weights: the program is the one planned


# phasing -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def phased_mlp():
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import phased_mlp
    finally:
        sys.path.remove(str(ROOT / "examples"))
    return phased_mlp


def test_phasing_the_seed_003_mlp_keeps_only_the_largest_phases_weights_on_chip(phased_mlp):
    # seed 003's network and phases (3 hidden layers of 512, fc1..fc3 forward, head forward
    # + loss + backward, fc3..fc1 backward), without RTS and Adam: weights only
    phased, *_ = phased_mlp.build_phased(3, 512, 8, 4, 0.05)
    plain, *_ = phased_mlp.build_unphased(3, 512, 32, 0.05)
    rp, ru = build_plan(phased, MK2).report(), build_plan(plain, MK2).report()
    fc1 = (784 * 512 + 512) * 4
    assert fc1 == 1_607_680
    assert ru.totals()["variables_on_chip_peak_bytes"] == 4 * PSI == 3_729_448
    assert rp.totals()["variable_bytes"] == 0
    assert rp.totals()["variables_on_chip_peak_bytes"] == fc1
    diff = ru.diff(rp, ("unphased", "phased"))
    assert diff["variables_on_chip_peak_bytes"] == (4 * PSI, fc1)
    assert rp.totals()["streaming_memory_bytes"] >= 4 * PSI  # the weights moved off chip


def test_seed_003_phased_program_holds_its_largest_phase_on_chip():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import seed003
    finally:
        sys.path.remove(str(ROOT / "tools"))
    path = seed003.find()
    if path is None:
        pytest.skip("seed 003 is not in the seeds folder (set POPXL_FX_SEEDS_DIR)")
    ns = seed003.definitions(path)
    phased = seed003.phased_session(ns)[0].report.to_dict()
    plain = seed003.unphased_program(ns, 64)[0].report.to_dict()
    # unphased: weights, Adam first order (float16) and second order (float32), all on chip
    assert plain["variable_bytes"] == plain["variables_on_chip_peak_bytes"] == (4 + 2 + 4) * PSI
    # phased, 2 replicas, tensors of >= 512 elements sharded: fc1's backward phase holds the
    # shards of its weight and bias, of their first and second order, and the gathered weight
    # and bias for the backward pass
    shards = 784 * 512 // 2 + 512 // 2
    fc1 = shards * (4 + 2 + 4) + (784 * 512 + 512) * 4
    assert fc1 == 3_617_280
    assert phased["variable_bytes"] == 0 and phased["replication_factor"] == 2
    assert phased["variables_on_chip_peak_bytes"] == fc1
