"""A folded run's group of small all-reduces in buffers kept between runs (`sim/fold_group.py`):
GPT's 53 gradients summed side by side into one kept total whose result views are made once;
its 9 layer norms' parameter gradients computed in one call at that group and its 17 linear
layers' weight and bias gradients written by their kernels into the group's rows
(`sim/fold_together.py`), with the fallbacks where a call's bits differ.
Every test compares the folded training run with the replicas' own run
(``CompileOptions(fold_replicas=False)``), 3 steps of SGD with momentum: losses, weights and
optimizer state equal (tolerance 0)."""

from __future__ import annotations

import pytest
import torch

from popxl_core.ops.layer_norm import LAYER_NORM_GRAD
from popxl_core.ops.linear import LINEAR_GRAD
from popxl_core.sim import fold_group
from tests.test_replica_folding import FOLD, _off, fold_fields
from tests.test_replica_stacking import _assert_same, _train


def _group(session):
    (state,) = session._replicas.fold.namespace["RT"].groups.values()
    return state


@pytest.mark.parametrize("replicas", [2, 4])
def test_the_group_keeps_its_total_and_result_views(replicas):
    folded, off = _train("gpt", replicas, FOLD), _off("gpt", replicas)
    _assert_same(folded, off)  # steps 2 and 3 reduced in the kept buffers
    kept = _group(folded[3]).kept
    base = kept.total.untyped_storage().data_ptr()
    assert len(kept.results) == 53
    assert all(r.untyped_storage().data_ptr() == base for r in kept.results)
    assert kept.rows.shape == (replicas, kept.total.numel())


def test_a_kept_layout_with_other_bits_is_not_kept(monkeypatch):
    """Where the kept layout's reduction (its columns reordered, the mean as one call) did
    not give the per-value results at the first call, every run reduces as before."""
    monkeypatch.setattr(fold_group.KeptGroup, "check", lambda self, values, op, want: False)
    folded, off = _train("gpt", 2, FOLD), _off("gpt", 2)
    _assert_same(folded, off)
    assert _group(folded[3]).kept is None and _group(folded[3]).flat


@pytest.fixture
def ln_grad_fold():
    yield from fold_fields(LAYER_NORM_GRAD)


@pytest.fixture
def linear_grad_fold():
    yield from fold_fields(LINEAR_GRAD)


def _sites(session, op_type: str) -> list:
    sites = session._replicas.fold.fold.sites
    return [s for s in sites if s.together is not None and s.op.type == op_type]


def _modes(session, op_type: str) -> set:
    """How the group made the values of ``op_type``'s `Together`s in the last run."""
    (togethers,) = session._replicas.fold.fold.together_groups.values()
    modes = _group(session).together
    return {modes[i].value for i, t in enumerate(togethers) if t.ops[0].type == op_type}


@pytest.mark.parametrize("replicas", [2, 4])
def test_parameter_gradients_are_made_at_the_group(replicas):
    """GPT: each layer norm's and linear layer's site computes dx; the group computes the 9
    layer norms' 18 parameter gradients in one call, and the 17 linear layers' weight and
    bias gradients are written by their GEMMs and sums into its rows; all checked equal to
    the replicas' own values. Left to the group as values: the embeddings' 2."""
    folded, off = _train("gpt", replicas, FOLD), _off("gpt", replicas)
    _assert_same(folded, off)
    session = folded[3]
    ln, lin = _sites(session, "LayerNormGrad"), _sites(session, "LinearGrad")
    assert len(ln) == 9 and len(lin) == 17
    assert all(s.chosen != s._each for s in ln + lin)  # dx matched: rest runs
    (togethers,) = session._replicas.fold.fold.together_groups.values()
    # the linear layers with a bias, the head without (a class of its own), the layer norms
    assert sorted(len(t.members) for t in togethers) == [1, 18, 32]
    assert _modes(session, "LayerNormGrad") == {"blocks"}
    assert _modes(session, "LinearGrad") == {"checked"}
    assert all(t.args == [None] * len(t.ops) for t in togethers)  # operands not kept
    kept = _group(session).kept
    assert len(kept.order) == 2 and len(kept.dest) == 33


def test_a_together_call_with_other_bits_falls_back_to_each_replica(ln_grad_fold):
    """The layer norms' together kernel one ulp off in every value: the group's first call
    finds it and later runs compute their parameter gradients with the replicas' own calls."""
    good, replace = ln_grad_fold

    def off_by_one_ulp(*args, **attrs):
        return [torch.nextafter(t, t + 1) for t in good.together(*args, **attrs)]

    replace(together=off_by_one_ulp)
    folded, off = _train("gpt", 2, FOLD), _off("gpt", 2)
    _assert_same(folded, off)
    assert len(_sites(folded[3], "LayerNormGrad")) == 9
    assert _modes(folded[3], "LayerNormGrad") == {"fill"}


def test_a_kernel_writing_other_bits_into_the_rows_falls_back(linear_grad_fold):
    """The linear layers' kernel writing one ulp off into the group's rows: the first write
    is checked against the replicas' own calls, their values are copied in instead, and
    every later run does so too."""
    good, replace = linear_grad_fold

    def off_by_one_ulp(calls, replicas, outs, **attrs):
        good.together(calls, replicas, outs, **attrs)
        for dest in outs:
            for t in dest:
                t.copy_(torch.nextafter(t, t + 1))

    replace(together=off_by_one_ulp)
    folded, off = _train("gpt", 2, FOLD), _off("gpt", 2)
    _assert_same(folded, off)
    assert _modes(folded[3], "LinearGrad") == {"each"}


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
    sites = _sites(folded[3], "LayerNormGrad")
    assert len(sites) == 9 and all(s.chosen == s._each for s in sites)
    assert _modes(folded[3], "LayerNormGrad") == {"fill"}


@pytest.mark.parametrize("fold", ["ln_grad_fold", "linear_grad_fold"])
def test_one_site_falling_back_leaves_the_others_to_their_replicas_calls(fold, request):
    """``rest`` off at its first call only: that site makes all of its outputs, and the
    group makes the other ops' values of its `Together` with the replicas' own calls (the
    together call is for all of them or none)."""
    good, replace = request.getfixturevalue(fold)
    calls = []

    def first_off(*args, **attrs):
        dx, *params = good.rest(*args, **attrs)
        calls.append(1)
        return (torch.nextafter(dx, dx + 1) if len(calls) == 1 else dx, *params)

    replace(rest=first_off)
    folded, off = _train("gpt", 4, FOLD), _off("gpt", 4)
    _assert_same(folded, off)
    op_type = "LayerNormGrad" if fold == "ln_grad_fold" else "LinearGrad"
    sites = _sites(folded[3], op_type)
    assert sum(s.chosen == s._each for s in sites) == 1
    assert "fill" in _modes(folded[3], op_type)  # that site's `Together` (one of two linear)
