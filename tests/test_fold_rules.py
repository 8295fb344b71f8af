"""The replica-fold rules of LayerNormGrad, Nll, NllGrad, the Reduce ops and the exact ones
(Reshape, Transpose, Add, Sub, Mul): each folded call over all replicas' rows against every
replica's own call on its rows (what a `BatchedSite` compares; tolerance 0, bit for bit), the
cases where a rule declines (its site then runs each replica's call), and folded against
unfolded replicated training of a model using them (tolerance 0).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import popxl_fx
from popxl_core.errors import OpDataError
from popxl_core.ops.elementwise import ADD, MUL, SUB
from popxl_core.ops.layer_norm import LAYER_NORM_GRAD
from popxl_core.ops.losses import NLL, NLL_GRAD
from popxl_core.ops.reduce import REDUCE_OPS
from popxl_core.ops.scatter_reduce import SCATTER_REDUCE
from popxl_core.ops.shape import RESHAPE, TRANSPOSE
from popxl_core.sim import CompileOptions
from popxl_core.sim.bits import same_bits
from popxl_core.sim.speed import fold_rule
from tests.test_replica_folding import set_fold
from tests.test_replica_stacking import _assert_same, _outcome

FOLD, OFF = CompileOptions(), CompileOptions(fold_replicas=False)
R = 4


def _own(opdef, args, per, attrs, numerics="torch"):
    """Every replica's own kernel call on its rows, outputs in replica order (concatenated;
    rank-0 outputs stacked): what `BatchedSite.each` computes."""
    kernel = opdef.kernel_for(numerics)
    cols = [a.split(a.shape[0] // R) if p else (a,) * R for a, p in zip(args, per)]
    outs = [kernel(*part, **attrs) for part in zip(*cols)]
    outs = [o if isinstance(o, tuple) else (o,) for o in outs]
    return tuple(torch.stack(c) if c[0].dim() == 0 else torch.cat(c) for c in zip(*outs))


def _folded(opdef, args, attrs, k=0, buffers=None):
    got = fold_rule(opdef).kernels[k](tuple(args), R, frozenset(), buffers, **attrs)
    return got if isinstance(got, tuple) else (got,)


def _assert_bits(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.shape == b.shape and same_bits(a, b)


def _g(seed):
    return torch.Generator().manual_seed(seed)


# LayerNormGrad -----------------------------------------------------------------------
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "shape, norm, has_weight, has_bias",
    [
        ((2, 16, 32), (32,), True, True),  # GPT's
        ((3, 5, 8), (8,), True, False),
        ((3, 5, 8), (8,), False, True),
        ((2, 3, 5, 8), (5, 8), True, True),
        ((7, 24), (24,), True, True),  # rows the threads split unevenly
    ],
)
def test_layer_norm_grad_side_by_side_is_each_replicas_bits(
    threads, shape, norm, has_weight, has_bias
):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = _g(0)
        x = torch.randn(R * shape[0], *shape[1:], generator=g)
        # a row of +0 and -0: mean +0, so the kernel's shift is -0 there (its sign must not
        # change the sums)
        x.view(-1, math.prod(norm))[5, 1::2] = 0.0
        x.view(-1, math.prod(norm))[5, ::2] = -0.0
        dy = torch.randn(x.shape, generator=g)
        w, b = torch.randn(norm, generator=g), torch.randn(norm, generator=g)
        _, mean, rstd = torch.native_layer_norm(x, list(norm), w, b, 1e-5)
        params = [t for t, h in ((w, has_weight), (b, has_bias)) if h]
        attrs = {"normalized_shape": norm, "has_weight": has_weight, "has_bias": has_bias}
        args = [dy, x, mean, rstd, *params]
        per = [True] * 4 + [False] * len(params)
        want = _own(LAYER_NORM_GRAD, args, per, attrs)
        _assert_bits(_folded(LAYER_NORM_GRAD, args, attrs, 0), want)  # side by side
        kept = {}  # its buffers kept between runs: a second run's values, not the first's
        _folded(LAYER_NORM_GRAD, args, attrs, 0, kept)
        args2 = [a.flip(0) if p else a for a, p in zip(args, per)]
        want2 = _own(LAYER_NORM_GRAD, args2, per, attrs)
        _assert_bits(_folded(LAYER_NORM_GRAD, args2, attrs, 0, kept), want2)
        assert kept
        _assert_bits(_folded(LAYER_NORM_GRAD, args, attrs, 1), want)  # per-replica sums
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def side_by_side_off():
    """LayerNormGrad's side-by-side kernel one ulp off (its rule's ``fold`` in
    `speed.REPLICA_BATCHING`: set, then put back): the fold site must take the next form,
    the per-replica sums."""
    good = fold_rule(LAYER_NORM_GRAD)

    def off(args, replicas, dead, buffers, **attrs):
        outs = good.kernels[0](args, replicas, dead, buffers, **attrs)
        return (outs[0], *(torch.nextafter(t, t + 1) for t in outs[1:]))

    kernels = (off, *good.kernels[1:])
    set_fold(LAYER_NORM_GRAD, dataclasses.replace(good, kernels=kernels))
    yield good
    set_fold(LAYER_NORM_GRAD, good)


def test_a_layer_norm_grad_form_with_other_bits_is_passed_over(side_by_side_off):
    folded, off = _train(LnNet, FOLD), _ln_off()
    _assert_same(folded, off)
    sites = [s for s in folded[3]._replicas.fold.fold.sites if s.op.type == "LayerNormGrad"]
    assert sites and all(s.chosen is s.checked.forms[1] for s in sites)


# Reduce ops ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(REDUCE_OPS))
@pytest.mark.parametrize(
    "axes, keepdims",
    [((0,), True), ((0,), False), ((0, 2), False), ((0, 1, 2), False), ((1,), True)],
)
def test_reduce_folds_each_replicas_rows(name, axes, keepdims):
    opdef = REDUCE_OPS[name]
    x = torch.rand(R * 3, 5, 6, generator=_g(1)) + 0.5  # positive: log and prod defined
    attrs = {"axes": axes, "keepdims": keepdims}
    for numerics in ("torch", "ipu"):
        want = _own(opdef, [x], [True], attrs, numerics)
        forms = [_folded(opdef, [x], attrs, k) for k in range(len(fold_rule(opdef).kernels))]
        assert any(
            len(f) == len(want) and all(same_bits(a, b) for a, b in zip(f, want)) for f in forms
        ), (name, numerics)


# Nll, NllGrad --------------------------------------------------------------------------
def _nll_args(rows=6, classes=5, seed=2):
    g = _g(seed)
    logp = torch.log_softmax(torch.randn(R * rows, classes, generator=g), -1)
    return logp, torch.randint(0, classes, (R * rows,), generator=g).to(torch.int32)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_and_its_gradient_fold(reduction):
    logp, lab = _nll_args(rows=37)  # a cascade of more than one level per replica
    attrs = {"reduction": reduction, "ignore_index": -100, "log_prob": True}
    _assert_bits(_folded(NLL, [logp, lab], attrs), _own(NLL, [logp, lab], [True, True], attrs))
    g = torch.rand(() if reduction != "none" else lab.shape, generator=_g(3))
    per = [True, True, reduction == "none"]
    assert fold_rule(NLL_GRAD).rows(attrs, [logp.shape, lab.shape, g.shape], per)
    want = _own(NLL_GRAD, [logp, lab, g], per, attrs)
    _assert_bits(_folded(NLL_GRAD, [logp, lab, g], attrs), want)


def test_nll_folds_decline_where_a_replica_counts_its_own_labels():
    """Probabilities (not log): Nll's mean is not eager's kernel; an ignore_index that is a
    class: each replica's label count needs its own forward. ValueError: the fold site runs
    each replica's own call."""
    logp, lab = _nll_args()
    probs = logp.exp()
    with pytest.raises(ValueError):
        _folded(NLL, [probs, lab], {"reduction": "mean", "ignore_index": None, "log_prob": False})
    attrs = {"reduction": "mean", "ignore_index": 2, "log_prob": True}
    with pytest.raises(ValueError):
        _folded(NLL_GRAD, [logp, lab, torch.tensor(1.0)], attrs)
    # a per-replica scalar loss gradient is not the shared one the folded gradient needs
    assert not fold_rule(NLL_GRAD).rows(attrs, [(24, 5), (24,), ()], [True, True, True])


def test_a_folded_nll_names_the_bad_label_by_its_replicas_index():
    logp, lab = _nll_args()
    lab[2 * 6 + 4] = 9  # replica 2's row 4
    attrs = {"reduction": "mean", "ignore_index": None, "log_prob": True}
    for op, args in ((NLL, [logp, lab]), (NLL_GRAD, [logp, lab, torch.tensor(1.0)])):
        with pytest.raises(OpDataError, match=r"label 9 at index \(4,\)"):
            _folded(op, args, attrs)


# ScatterReduce (an embedding's gradient) ------------------------------------------------
@pytest.mark.parametrize("low", [0, -2])  # every index in range; some cut off (<0, >= 6)
def test_scatter_reduce_folds_each_replicas_rows(low):
    g = _g(5)
    data = torch.randn(R * 7, 3, generator=g)
    idx = torch.randint(low, 6 - low, (R * 7,), generator=g).to(torch.int32)
    attrs = {"reduction": "sum", "axis": 0, "axis_size": 6, "enable_index_broadcast": True}
    want = _own(SCATTER_REDUCE, [data, idx], [True, True], attrs)
    _assert_bits(_folded(SCATTER_REDUCE, [data, idx], attrs), want)


# exact rules -----------------------------------------------------------------------------
def test_exact_rules_are_each_replicas_bits():
    g = _g(4)
    x, w = torch.randn(R * 3, 5, 8, generator=g), torch.randn(8, generator=g)
    y = torch.randn(x.shape, generator=g)
    for opdef in (ADD, SUB, MUL):
        assert fold_rule(opdef).exact
        for args, per in (([x, w], [True, False]), ([x, y], [True, True])):
            shapes = [(3, *a.shape[1:]) if p else tuple(a.shape) for a, p in zip(args, per)]
            assert fold_rule(opdef).rows({}, shapes, per)
            _assert_bits((opdef.kernel(*args),), _own(opdef, args, per, {}))
    rule = fold_rule(RESHAPE)
    attrs = {"shape": (3, 40)}
    got = RESHAPE.kernel(x, **rule.attrs(attrs, R))
    _assert_bits((got,), _own(RESHAPE, [x], [True], attrs))
    attrs = {"permutation": (0, 2, 1)}
    assert fold_rule(TRANSPOSE).exact and fold_rule(TRANSPOSE).rows(attrs, [(3, 5, 8)], [True])
    _assert_bits((TRANSPOSE.kernel(x, **attrs),), _own(TRANSPOSE, [x], [True], attrs))
    assert not fold_rule(TRANSPOSE).rows({"permutation": (1, 0, 2)}, [(3, 5, 8)], [True])


# folded against unfolded training -------------------------------------------------------
class LnNet(nn.Module):
    """LayerNorms over one and two axes (weight only; weight and bias), a mean over the
    batch, a sum and cross entropy: the rules above in one replicated training step."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.ln1 = nn.LayerNorm(8, bias=False)
        self.ln2 = nn.LayerNorm((5, 8))
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        h = self.ln2(self.ln1(self.fc(x)) * 2.0 - x)
        return self.head(h + h.mean(0, keepdim=True)).sum(1)


def _train(model, compiler, steps=3):
    torch.manual_seed(0)
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    options = popxl_fx.Options(device="cpu", replication_factor=R, compiler=compiler)
    trainer = popxl_fx.training_model(net, opt, F.cross_entropy, options)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(R * 2, 5, 8, generator=g)
        losses.append(trainer(x, torch.randint(0, 3, (R * 2,), generator=g)))
    return _outcome(losses, net, opt, trainer._programs.active.session)


@functools.lru_cache(maxsize=None)
def _ln_off():
    """The unfolded run, made once: it never reads the fold rules the fixtures patch."""
    return _train(LnNet, OFF)


def test_layer_norms_and_reductions_fold_bitwise():
    folded, off = _train(LnNet, FOLD), _ln_off()
    _assert_same(folded, off)
    session = folded[3]
    assert session._replicas.fold.namespace["RT"].runs == 3
    sites = session._replicas.fold.fold.sites
    # a replica's batch mean broadcast back over its own rows (its Add and the mean's
    # gradient) has no rule: each replica's own call. Every other site has a folded kernel,
    # chosen where it gives each replica's bits on this CPU: which do is the CPU's to say
    # (on an Intel Xeon with torch 2.11 one Linear's did not), so not asserted here; the
    # bits of the run are (`_assert_same` above)
    assert sorted(s.op.type for s in sites if not s.checked.forms) == [
        "Add",
        "ReduceSumGrad",
        "ReduceSumGrad",
    ]
    assert {"LayerNormGrad", "Nll", "NllGrad"} <= {s.op.type for s in sites}
    assert session._replicas.fold.stats["exact_folded_ops"] > 0


# per-step host work of a replicated step ----------------------------------------------------
def test_replica_feeds_are_one_array_seen_equal_at_once():
    """The optimizer's hyper-parameters for every replica are one array broadcast (stride 0
    along the replicas, with or without a leading device-iterations dimension), which the
    shared run's stream check takes as equal without comparing bytes; other arrays are still
    compared. The views are kept by the program's `ReplicaFeeds`, not by the module."""
    import numpy as np

    from popxl_core.sim.uniform import _same_replicas
    from popxl_fx.replication import ReplicaFeeds

    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    # contiguous (the ndarray view), transposed (np.broadcast_to), a 0-d scalar
    for b in (a, a.T, np.asarray(np.float32(0.5))):
        for iterations, lead in ((1, 0), (2, 1)) if b.ndim else ((1, 0),):
            got = ReplicaFeeds(R, iterations)({"s": b})["s"]
            want = np.stack([b] * R, axis=lead)
            assert got.shape == want.shape and np.array_equal(got, want)
            assert got.strides[lead] == 0 and not got.flags.writeable
    assert _same_replicas(ReplicaFeeds(R, 2)({"s": a})["s"])
    # the same array fed again (an SGD step's hyper-parameters): the same view, which shares
    # its memory (an in-place write shows); another array or shape: a view of its own
    feeds = ReplicaFeeds(R)
    b = np.full((3,), 0.5, np.float32)
    first = feeds({"s": b})["s"]
    assert feeds({"s": b})["s"] is first
    b[1] = 2.0
    assert np.array_equal(first, np.stack([b] * R))
    c = b.copy()
    assert feeds({"s": c})["s"] is not first
    b.shape = (3, 1)
    assert feeds({"s": b})["s"].shape == (R, 3, 1)
    assert ReplicaFeeds(R + 1)({"s": b})["s"].shape == (R + 1, 3, 1)
    # arrays no longer fed (Adam's, new each step) are not kept
    for _ in range(20):
        feeds({"s": np.zeros(3, np.float32)})
    assert len(feeds._views) <= 5
    rows = np.stack([a] * R, axis=1)
    assert _same_replicas(rows)
    rows[1, 2, 0] += 1
    assert not _same_replicas(rows)
