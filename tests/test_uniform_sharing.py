"""Replica-uniform work run once (popxl_core/sim/uniform.py) against the same program with it
switched off (``CompileOptions(share_uniform=False)``: every replica runs everything on its
own copies): losses, weights, optimizer state and per-replica reads equal bit for bit
(tolerance 0), with SGD and Adam, with and without RTS, grouped all-reduces, and runs where
host data makes the replicas differ.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import popxl_core as popxl
import popxl_fx
from popxl_core import ops
from popxl_core.ops import collectives as coll
from popxl_core.sim import CompileOptions
from tests.fx_zoo import SeedMLP

# replica folding off (fold.py; tests/test_replica_folding.py): the followers run here
SHARED, UNSHARED = CompileOptions(fold_replicas=False), CompileOptions(share_uniform=False)
OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-4),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-3),
}


def _fx_train(opt: str, replicas: int, rts: bool, compiler: CompileOptions, steps: int = 3):
    torch.manual_seed(0)
    model = SeedMLP()
    optimizer = OPTIMIZERS[opt](model.parameters())
    options = popxl_fx.Options(
        device="cpu",
        replication_factor=replicas,
        replicated_tensor_sharding=rts,
        compiler=compiler,
    )
    trainer = popxl_fx.training_model(model, optimizer, F.cross_entropy, options)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(8, 1, 28, 28, generator=g), torch.randint(0, 10, (8,), generator=g)
        losses.append(trainer(x, y))
    state = {(i, k): v for i, s in optimizer.state_dict()["state"].items() for k, v in s.items()}
    return torch.stack(losses), model.state_dict(), state, trainer._programs.active.session


def _assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize(
    "opt, replicas, rts",
    [("sgd", 4, False), ("adam", 2, False), ("sgd", 2, True), ("adam", 4, True)],
)
def test_popxl_fx_training_shared_is_bitwise_the_unshared(opt, replicas, rts):
    losses, params, state, session = _fx_train(opt, replicas, rts, SHARED)
    losses0, params0, state0, session0 = _fx_train(opt, replicas, rts, UNSHARED)
    assert torch.equal(losses, losses0)
    _assert_same(params, params0)
    _assert_same(state, state0)
    assert session0._program.sharing is None
    if not rts:  # the update of every weight (and its optimizer state) ran once per step
        sharing = session._program.sharing
        assert sharing is not None and session._replicas.sharing.active
        assert len(sharing.variables) == len(session._program.variables)
    # each replica's weight gradients go into buffers of its own, kept between steps
    assert session._program.stats["buffered_ops"] == 4


# hand-written programs ------------------------------------------------------------------
R, ROWS, D = 4, 3, 5


def _build(hazard: bool = False, grouped: bool = False):
    """x @ w per replica, its all-reduced x.T @ y scaled by a streamed lr updates w in place;
    ``hazard``: a read of w after the all-reduce and before the update (a follower running
    after the leader's update would see the new w); ``grouped``: a second weight updated from
    an all-reduce over groups of 2 (not uniform)."""
    ir = popxl.Ir(R)
    rng = np.random.default_rng(0)
    with ir.main_graph, popxl.in_sequence():
        w = popxl.variable(rng.standard_normal((D, D)).astype(np.float32), name="w")
        v = popxl.variable(rng.standard_normal((D, D)).astype(np.float32), name="v")
        xs, lrs = (
            popxl.h2d_stream((ROWS, D), popxl.float32, "x"),
            popxl.h2d_stream((), popxl.float32, "lr"),
        )
        x, lr = ops.host_load(xs), ops.host_load(lrs)
        y = x @ w
        g = coll.replicated_all_reduce(ops.matmul(ops.transpose(x), y), "mean")
        outs = [y]
        if hazard:
            outs.append(x @ w)
        ops.scaled_add_(w, g, 1.0, lr)
        if grouped:
            gv = coll.replicated_all_reduce(x.T @ (x @ v), "add", ir.replica_grouping(1, 2))
            ops.scaled_add_(v, gv, 1.0, lr)
        outs += [x @ w, w, v]  # after the update: the leader's write is already there
        streams = []
        for t in outs:
            streams.append(popxl.d2h_stream(t.shape, t.dtype, f"out{len(streams)}"))
            ops.host_store(streams[-1], t)
    return ir, xs, lrs, streams, (w, v)


def _runs(compiler, lrs_per_run, hazard=False, grouped=False, write=None):
    """Runs with ``lrs_per_run[k]`` (one lr per replica); ``write``: (run, value) to write
    into w before that run. Returns every stored output (w and v of every replica too) and
    the host's w after each run."""
    ir, xs, lrs, streams, (w, v) = _build(hazard, grouped)
    rng = np.random.default_rng(1)
    got = []
    with popxl.Session(ir, "cpu", compile_options=compiler) as sess:
        for k, lr in enumerate(lrs_per_run):
            if write is not None and write[0] == k:
                sess.write_variable_data(w, write[1])
            x = rng.standard_normal((R, ROWS, D)).astype(np.float32)
            res = sess.run({xs: x, lrs: np.asarray(lr, np.float32)})
            got.append([res[s] for s in streams])
            got.append([sess.get_tensor_data(w).copy()])
        sharing, active = getattr(sess._program, "sharing", None), sess._replicas.sharing.active
    return got, sharing, active


def _same_runs(a, b) -> None:
    for xs, ys in zip(a, b):
        for p, q in zip(xs, ys):
            np.testing.assert_array_equal(p.view(np.uint32), q.view(np.uint32))


SAME_LR = [[-0.1] * R] * 3


def test_hand_written_update_runs_once_bit_for_bit():
    got, sharing, active = _runs(SHARED, SAME_LR)
    want, none, _ = _runs(UNSHARED, SAME_LR)
    _same_runs(got, want)
    assert none is None and active and len(sharing.variables) == 1  # w; v is only read


def test_kept_buffers_and_sharing_against_the_reference_interpreter():
    """The all-reduce results kept between runs and the shared update, against the plain
    reference interpreter (no kept buffers, no sharing), across runs where the replicas'
    data differ and agree again."""
    lrs = [[-0.1] * R, [-0.1, -0.2, -0.3, -0.4], [-0.1] * R]
    got, _, _ = _runs(SHARED, lrs)
    want, _, _ = _runs(CompileOptions(interpret=True), lrs)
    _same_runs(got, want)


def test_read_before_the_update_in_the_same_segment_keeps_copies():
    got, sharing, _ = _runs(SHARED, SAME_LR, hazard=True)
    want, _, _ = _runs(UNSHARED, SAME_LR, hazard=True)
    _same_runs(got, want)
    assert sharing is None  # w would be read after the leader updated it


def test_grouped_all_reduce_is_not_shared():
    got, sharing, active = _runs(SHARED, SAME_LR, grouped=True)
    want, _, _ = _runs(UNSHARED, SAME_LR, grouped=True)
    _same_runs(got, want)
    assert active and len(sharing.variables) == 1  # w shared; v per group, each replica's


def test_host_data_that_makes_replicas_differ_unshares():
    """Run 1 streams a different lr to each replica: that run, and the runs after it (the
    weights now differ), are the unshared program; a host write makes them equal again and
    sharing resumes."""
    lrs = [[-0.1] * R, [-0.1, -0.2, -0.3, -0.4], [-0.1] * R, [-0.1] * R, [-0.1] * R]
    write = (3, np.full((D, D), 0.25, np.float32))
    got, _, active = _runs(SHARED, lrs, write=write)
    want, _, _ = _runs(UNSHARED, lrs, write=write)
    _same_runs(got, want)
    w_after_differing_run = got[2][-2]  # run 1's stored w, [replica, ...]
    assert not np.array_equal(w_after_differing_run[0], w_after_differing_run[1])
    assert active


def test_switch_is_a_compile_option():
    with pytest.raises(TypeError, match="share_uniform"):
        CompileOptions(share_uniform=1)


def _no_collectives(read_first: bool, compiler: CompileOptions):
    """No collective: the replicas run one after the other. ``w += 1`` (uniform) with the
    weight read by each replica before it (``read_first``: a follower would read the leader's
    update) or only after it."""
    ir = popxl.Ir(R)
    with ir.main_graph, popxl.in_sequence():
        w = popxl.variable(np.arange(D, dtype=np.float32), name="w")
        xs = popxl.h2d_stream((D,), popxl.float32, "x")
        x = ops.host_load(xs)
        outs = [x * w] if read_first else []
        ops.add_(w, popxl.constant(np.ones(D, np.float32)))
        outs.append(x * w)
        streams = [popxl.d2h_stream((D,), popxl.float32, f"o{i}") for i in range(len(outs))]
        for s, t in zip(streams, outs):
            ops.host_store(s, t)
    x = np.random.default_rng(2).standard_normal((R, D)).astype(np.float32)
    with popxl.Session(ir, "cpu", compile_options=compiler) as sess:
        res = [[sess.run({xs: x})[s] for s in streams] for _ in range(2)]
        return res, sess._program.sharing


@pytest.mark.parametrize("read_first", [False, True])
def test_replicas_without_collectives(read_first):
    got, sharing = _no_collectives(read_first, SHARED)
    want, _ = _no_collectives(read_first, UNSHARED)
    _same_runs(got, want)
    assert (sharing is None) == read_first
