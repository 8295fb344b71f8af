"""Replica folding (popxl_core/sim/fold.py): the replicas' step run once over their rows
against the same program with it switched off (``CompileOptions(fold_replicas=False)``: the
replicas run in lock step, as before). Losses, weights and optimizer state equal bit for bit
(tolerance 0) for the seed MLP and GPT at 2 and 4 replicas, and where folding falls back:
an op without a rule, a folded call whose bits differ, an unshared run, a thread change.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from popxl_core.ops.linear import LINEAR_GRAD
from popxl_core.sim import CompileOptions
from popxl_core.sim.batched_site import BatchedSite, RowsAt
from popxl_core.sim.speed import REPLICA_BATCHING, fold_rule
from tests.test_replica_stacking import _assert_same, _train

FOLD, OFF = CompileOptions(), CompileOptions(fold_replicas=False)


@functools.lru_cache(maxsize=None)
def _off(model: str, replicas: int):
    """The replicas' own run (``OFF``), the reference of many tests here and in
    test_replica_fold_reduce.py: made once per model and replica count. Only for tests whose
    patches touch folding alone (the fold rules, `fold_reduce`): an unfolded run never reads
    them (``_fold`` is None, asserted below)."""
    return _train(model, replicas, OFF)


def _sites(session) -> list:
    return list(session._replicas.fold.fold.sites)


def _each(site) -> bool:
    """The site runs each replica's own call (no folded call, or none gave its bits; where
    it all-reduces an output, `fold_reduce.ReducedOutputs`, before that reduction)."""
    if site.reduced is not None and site.chosen is not None:
        return site.reduced.fallback == site._each
    return site.chosen is not None and site.chosen == site._each


def _chosen(session, name: str) -> set:
    return {"_each" if _each(s) else "folded" for s in _sites(session) if s.op.type == name}


@pytest.mark.parametrize("model, replicas", [("mlp", 2), ("mlp", 4), ("gpt", 2), ("gpt", 4)])
def test_folded_is_bitwise_the_replicas_run(model, replicas):
    folded, off = _train(model, replicas, FOLD), _off(model, replicas)
    _assert_same(folded, off)
    session = folded[3]
    assert off[3]._replicas.fold is None
    assert session._replicas.fold.namespace["RT"].runs == 3  # every step ran folded
    sites = _sites(session)
    # every op with a rule has a folded call; which ones pass their bit check depends on the
    # CPU's kernels (MKL picks GEMMs per shape and CPU: the test does not gate on that), but
    # pure data movement folds everywhere, and so do the loss (each replica's own sum, one
    # label check) and its gradient (one call: the same value at every label). Every op of
    # both models has a rule
    ruled = [s for s in sites if s.checked.forms]
    assert session._replicas.fold.stats["folded_ops"] == len(ruled) == len(sites)
    assert all(s.chosen is not None for s in sites)
    moves = {"Reshape", "Transpose", "Split", "Concat", "Gather", "Slice", "SliceGrad"}
    assert [s.op.type for s in ruled if s.op.type in moves and _each(s)] == []
    assert _chosen(session, "Nll") == _chosen(session, "NllGrad") == {"folded"}


def one_ulp_off(kernel):
    """``kernel`` with every output one ulp off."""

    def off_by_one_ulp(*args, **attrs):
        outs = kernel(*args, **attrs)
        return tuple(None if t is None else torch.nextafter(t, t + 1) for t in outs)

    return off_by_one_ulp


def fold_fields(opdef):
    """Sets ``opdef``'s `ReplicaFold` fields for one test (its rule's ``fold`` in the sim's
    `speed.REPLICA_BATCHING` table: set, then put back); a fixture's body,
    ``yield from fold_fields(OPDEF)``."""
    good = fold_rule(opdef)

    def replace(**fields):
        set_fold(opdef, dataclasses.replace(good, **fields))

    yield good, replace
    set_fold(opdef, good)


def set_fold(opdef, fold) -> None:
    """``opdef``'s rule in `speed.REPLICA_BATCHING` with ``fold`` as its fold form."""
    rule = REPLICA_BATCHING.rows[opdef]
    REPLICA_BATCHING.rows[opdef] = dataclasses.replace(rule, fold=fold)


@pytest.fixture
def linear_grad_fold():
    """LinearGrad's `ReplicaFold` fields, settable for one test (`fold_fields`)."""
    yield from fold_fields(LINEAR_GRAD)


@pytest.fixture
def linear_grad_off(linear_grad_fold):
    """LinearGrad's folded kernels, and those all-reducing its weight gradient, one ulp
    off."""
    good, replace = linear_grad_fold
    replace(kernels=(one_ulp_off(good.kernels[0]),), reduced=(one_ulp_off(good.reduced[0]),))


def test_a_folded_call_with_other_bits_falls_back(linear_grad_off):
    """A folded kernel one ulp off is never used: the replicas' own calls run there."""
    folded, off = _train("mlp", 2, FOLD), _off("mlp", 2)
    _assert_same(folded, off)
    assert _chosen(folded[3], "LinearGrad") == {"_each"}


def test_unshared_runs_are_not_folded():
    """Without uniform sharing there is no fold; a run the session does not share (here:
    made so by a host write of the weights with the replicas' copies unshared) runs the
    replicas as before."""
    unshared = _train("mlp", 2, CompileOptions(share_uniform=False))
    assert unshared[3]._replicas.fold is None
    _assert_same(unshared, _off("mlp", 2))


def test_a_run_the_session_does_not_share_runs_unfolded(monkeypatch):
    from popxl_core.sim import uniform

    monkeypatch.setattr(uniform.SharedRuns, "prepare", lambda self, *a: self.unshare(a[0]))
    folded = _train("mlp", 2, FOLD)
    assert folded[3]._replicas.fold.namespace["RT"].runs == 0
    _assert_same(folded, _train("mlp", 2, OFF))


def test_a_thread_count_change_checks_again():
    threads = torch.get_num_threads()
    try:
        folded = _train("gpt", 2, FOLD, steps=1)
        session = folded[3]
        torch.set_num_threads(1 if threads > 1 else 2)
        session._replicas.fold.namespace["RT"].start({}, {})
        assert all(s.chosen is None for s in _sites(session))
    finally:
        torch.set_num_threads(threads)


def test_sites_are_fold_sites_of_the_folded_program():
    session = _train("mlp", 2, FOLD, steps=1)[3]
    assert all(isinstance(s, BatchedSite) for s in _sites(session))
    assert {s.rows_at for s in _sites(session)} == {RowsAt.STEP}
    assert session._program.fold is None and session._replicas.fold.fold is not None


@pytest.mark.parametrize("opt, replicas", [("adam", 2), ("sgd", 4)])
def test_folded_optimizers_and_rts_are_bitwise(opt, replicas):
    """Adam and SGD with weight decay: folded against unfolded; with RTS (weights sharded
    across the replicas) the preconditions fail and the run is not folded."""
    from tests.test_uniform_sharing import _fx_train

    for rts in (False, True):
        a = _fx_train(opt, replicas, rts, FOLD)
        b = _fx_train(opt, replicas, rts, OFF)
        _assert_same(a, b)
        assert (a[3]._replicas.fold is None) == rts
