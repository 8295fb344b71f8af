"""A folded run's group of small all-reduces in buffers kept between runs (`sim/fold_group.py`):
GPT's 53 gradients summed side by side into one kept total whose result views are made once;
its 9 layer norms' parameter gradients computed in one call at that group
(`sim/fold_together.py`), with the fallbacks where a call's bits differ.
Every test compares the folded training run with the replicas' own run
(``CompileOptions(fold_replicas=False)``), 3 steps of SGD with momentum: losses, weights and
optimizer state equal (tolerance 0)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from popxl_core.ops.layer_norm import LAYER_NORM_GRAD
from tests.test_replica_folding import FOLD, _off  # noqa: F401 (cached references)
from tests.test_replica_stacking import _assert_same, _train


def _group(session):
    (state,) = session._fold.namespace["RT"].groups.values()
    return state


@pytest.mark.parametrize("replicas", [2, 4])
def test_the_group_keeps_its_total_and_result_views(replicas):
    folded, off = _train("gpt", replicas, FOLD), _off("gpt", replicas)
    _assert_same(folded, off)  # steps 2 and 3 reduced in the kept buffers
    kept = _group(folded[3])["kept"]
    base = kept.total.untyped_storage().data_ptr()
    assert len(kept.results) == 53
    assert all(r.untyped_storage().data_ptr() == base for r in kept.results)
    assert kept.rows.shape == (replicas, kept.total.numel())


@pytest.fixture
def ln_grad_fold():
    """Sets LayerNormGrad's `ReplicaFold` fields for one test (the op table is frozen: set,
    then put back)."""
    good = LAYER_NORM_GRAD.replica_fold

    def replace(**fields):
        object.__setattr__(LAYER_NORM_GRAD, "replica_fold", dataclasses.replace(good, **fields))

    yield good, replace
    object.__setattr__(LAYER_NORM_GRAD, "replica_fold", good)


def _together_sites(session) -> list:
    return [s for s in session._fold.fold.sites if s.together is not None]


@pytest.mark.parametrize("replicas", [2, 4])
def test_the_layer_norms_parameter_gradients_are_made_together_at_the_group(replicas):
    """GPT's 9 layer norms: each site computes dx, the group their 18 parameter gradients
    in one call (`fold_together.py`), checked equal to the replicas' own values."""
    folded, off = _train("gpt", replicas, FOLD), _off("gpt", replicas)
    _assert_same(folded, off)
    sites = _together_sites(folded[3])
    assert len(sites) == 9 and {s.op.type for s in sites} == {"LayerNormGrad"}
    assert all(s.chosen != s._each for s in sites)  # dx matched: rest runs
    (together,) = folded[3]._fold.fold.together_groups.values()
    assert len(together.members) == 18
    assert _group(folded[3])["together"] is True
    assert together.args == [None] * 9  # the operands are not kept past the group


def test_a_together_call_with_other_bits_falls_back_to_each_replica(ln_grad_fold):
    """The together kernel one ulp off in every value: the group's first call finds it and
    later runs compute each layer norm's parameter gradients with the replicas' own calls."""
    good, replace = ln_grad_fold

    def off_by_one_ulp(*args, **attrs):
        return [torch.nextafter(t, t + 1) for t in good.together(*args, **attrs)]

    replace(together=off_by_one_ulp)
    folded, off = _train("gpt", 2, FOLD), _off("gpt", 2)
    _assert_same(folded, off)
    assert len(_together_sites(folded[3])) == 9
    assert _group(folded[3])["together"] is False


def test_a_layer_norm_whose_dx_falls_back_makes_its_own_parameter_gradients(ln_grad_fold):
    """``rest`` one ulp off: every layer norm's site runs the replicas' own calls (all three
    outputs), and the group reduces those as they come (no together call)."""
    good, replace = ln_grad_fold

    def off_by_one_ulp(*args, **attrs):
        dx, *params = good.rest(*args, **attrs)
        return (torch.nextafter(dx, dx + 1), *params)

    replace(rest=off_by_one_ulp)
    folded, off = _train("gpt", 2, FOLD), _off("gpt", 2)
    _assert_same(folded, off)
    sites = _together_sites(folded[3])
    assert len(sites) == 9 and all(s.chosen == s._each for s in sites)
    assert _group(folded[3])["together"] is False


def test_one_layer_norm_falling_back_leaves_the_others_to_their_replicas_calls(ln_grad_fold):
    """``rest`` off at its first call only: that layer norm's site makes all of its
    outputs, and the group makes the other 8 layer norms' parameter gradients with the
    replicas' own calls (the together call is for all of them or none)."""
    good, replace = ln_grad_fold
    calls = []

    def first_off(*args, **attrs):
        dx, *params = good.rest(*args, **attrs)
        calls.append(1)
        return (torch.nextafter(dx, dx + 1) if len(calls) == 1 else dx, *params)

    replace(rest=first_off)
    folded, off = _train("gpt", 4, FOLD), _off("gpt", 4)
    _assert_same(folded, off)
    sites = _together_sites(folded[3])
    assert sum(s.chosen == s._each for s in sites) == 1
    assert _group(folded[3])["together"] is False
