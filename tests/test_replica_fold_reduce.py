"""Weight gradients all-reduced by the folded op that makes them (`fold_reduce.plan_fused`,
`fold_reduce.ReducedOutputs`): a folded `LinearGrad` returns its weight gradient already
all-reduced (each replica's GEMM added onto the first in replica order) and the all-reduce
passes it on. Every test compares the folded run with the replicas' own run
(``CompileOptions(fold_replicas=False)``): losses, weights and optimizer state equal bit for
bit (tolerance 0), with the fused kernel, where it is one ulp off (the site falls back to
its unreduced call and the all-reduce's own reduction), for ``mean`` and ``add``, and for
every gradient size.
"""

from __future__ import annotations

import importlib
import re

import pytest
import torch

from popxl_core import ops
from popxl_core.ops.collectives.collectives import divide_mean
from popxl_core.sim import fold_reduce
from tests.test_replica_folding import (  # noqa: F401 (fixtures)
    FOLD,
    OFF,
    _each,
    _off,
    linear_grad_fold,
    one_ulp_off,
)
from tests.test_replica_stacking import _assert_same, _train

linear = importlib.import_module("popxl_core.ops.linear")  # the module, not ``ops.linear``


def _reduced_sites(session) -> list:
    return [s for s in session._replicas.fold.fold.sites if s.reduced is not None]


def _fused(session) -> list:
    """The all-reduces the folded ops making their inputs compute (`ReduceBy.SITE`)."""
    reduce_by = session._replicas.fold.fold.reduce_by
    return [op for op, by in reduce_by.items() if by is fold_reduce.ReduceBy.SITE]


def _passed_on(session) -> int:
    """Lines of the folded main graph where an all-reduce passes its input on."""
    return len(re.findall(r"^\s*v\d+ = v\d+$", session._replicas.fold.main.source, re.M))


def test_the_mlp_weight_gradients_are_reduced_by_their_linear_grad():
    folded, off = _train("mlp", 4, FOLD), _off("mlp", 4)
    _assert_same(folded, off)
    session = folded[3]
    # the three 512-wide layers' weight gradients (>= FUSE_BYTES) and their biases'; then
    # the last layer's 10 x 512 (20 KiB) and bias, whose two all-reduces alone would make a
    # group call: no all-reduce call is left
    shapes = sorted(tuple(op.inputs[0].shape) for op in _fused(session))
    assert shapes == [(10,), (10, 512)] + [(512,)] * 3 + [(512, 512), (512, 512), (512, 784)]
    assert [s.op.type for s in _reduced_sites(session)] == ["LinearGrad"] * 4
    assert all(s.reduced.kinds == {1: "mean", 2: "mean"} for s in _reduced_sites(session))
    assert _passed_on(session) == 8
    assert "RT.collective" not in session._replicas.fold.main.source
    assert "RT.all_reduce_group" not in session._replicas.fold.main.source
    # whether the fused GEMM chain gives the all-reduce's bits is the CPU's GEMM's matter
    # (checked per shape): every site was checked and chose a call
    assert all(s.chosen is not None for s in _reduced_sites(session))


@pytest.mark.parametrize("model, replicas", [("mlp", 2), ("gpt", 2), ("gpt", 4)])
def test_every_gradient_size_fused_is_bitwise(model, replicas, monkeypatch):
    """With no size floor every weight gradient only an all-reduce reads is fused (GPT's
    small ones too)."""
    monkeypatch.setattr(fold_reduce, "FUSE_BYTES", 0)
    folded, off = _train(model, replicas, FOLD), _off(model, replicas)
    _assert_same(folded, off)
    sites = _reduced_sites(folded[3])
    assert sites and _passed_on(folded[3]) == len(_fused(folded[3]))
    assert _passed_on(folded[3]) == sum(len(s.reduced.kinds) for s in sites)


def test_a_sum_all_reduce_is_fused_bitwise(monkeypatch):
    """``add`` all-reduces (here every gradient's, in place of popxl_fx's ``mean``)."""
    reduce = ops.collectives.replicated_all_reduce
    monkeypatch.setattr(
        ops.collectives, "replicated_all_reduce", lambda t, op="add", **kw: reduce(t, "add", **kw)
    )
    folded, off = _train("mlp", 2, FOLD), _train("mlp", 2, OFF)
    _assert_same(folded, off)
    assert {s.reduced.kinds[1] for s in _reduced_sites(folded[3])} == {"add"}


def test_a_reduced_kernel_off_falls_back_to_the_folded_call(linear_grad_fold):  # noqa: F811
    """The fused kernel one ulp off: the site computes the replicas' gradients by its
    folded call, then the all-reduce's own reduction (one sum where it gives its bits)."""
    good, replace = linear_grad_fold
    replace(reduced=tuple(one_ulp_off(k) for k in good.reduced))
    folded, off = _train("mlp", 4, FOLD), _off("mlp", 4)
    _assert_same(folded, off)
    sites = _reduced_sites(folded[3])
    assert len(sites) == 4
    assert all(s.reduced.fallback is not None for s in sites)
    assert all(s.chosen not in s.reduced.calls for s in sites)


def test_everything_one_ulp_off_falls_back_to_each_replica(linear_grad_fold):  # noqa: F811
    good, replace = linear_grad_fold
    replace(
        kernels=tuple(one_ulp_off(k) for k in good.kernels),
        reduced=tuple(one_ulp_off(k) for k in good.reduced),
    )
    folded, off = _train("mlp", 2, FOLD), _off("mlp", 2)
    _assert_same(folded, off)
    sites = _reduced_sites(folded[3])
    assert sites and all(_each(s) for s in sites)


def test_a_gradient_something_else_reads_is_not_fused(monkeypatch):
    """An all-reduce whose input another op reads too (here: every all-reduce's input read
    twice, faked by the readers' count) keeps the replicas' values and its own reduction."""
    monkeypatch.setattr(fold_reduce, "Counter", lambda xs: {t: 2 for t in xs})
    folded, off = _train("mlp", 2, FOLD), _off("mlp", 2)
    _assert_same(folded, off)
    assert not _fused(folded[3]) and not _reduced_sites(folded[3])


def _train_with_writes(compiler, replicas: int = 4, steps: int = 3):
    """The seed MLP, SGD with momentum; between steps the user writes a weight and a
    momentum buffer in place."""
    import torch
    import torch.nn.functional as F

    import popxl_fx
    from tests.test_replica_stacking import _data, _model, _outcome

    torch.manual_seed(0)
    net = _model("mlp")
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    options = popxl_fx.Options(device="cpu", replication_factor=replicas, compiler=compiler)
    trainer = popxl_fx.training_model(net, opt, F.cross_entropy, options)
    g = torch.Generator().manual_seed(1)
    losses = []
    for step in range(steps):
        losses.append(trainer(*_data("mlp", 4 * replicas, g)))
        with torch.no_grad():
            net.fc1.weight[step].mul_(0.5)
            opt.state[net.fc2.weight]["momentum_buffer"][:, step].add_(1e-3)
    return _outcome(losses, net, opt, trainer._programs.active)


def test_torch_tensors_are_replica_0s_values_and_writes_reach_every_replica():
    """No copy back: each parameter and momentum buffer is replica 0's device tensor (the
    replicas' one copy in a folded run); in-place writes between steps reach every replica,
    bit for bit with the unfolded run."""
    folded, off = _train_with_writes(FOLD), _train_with_writes(OFF)
    _assert_same(folded[:3], off[:3])
    prog = folded[3]
    device = {t.data_ptr() for t in prog.session._device[0]}
    assert prog.extra.shared.copied == []
    assert all(p.data_ptr() in device for p in folded[1].values())
    assert all(s.data_ptr() in device for s in folded[2].values())
    assert prog.session._replicas.fold.namespace["RT"].runs == 3


def test_the_addmm_chain_variant_is_bitwise(linear_grad_fold):  # noqa: F811
    """The reduced kernel's ``addmm_`` calls one by one (tried after ``addbmm``)."""
    good, replace = linear_grad_fold
    replace(reduced=tuple(k for k in good.reduced if not k.keywords["batched"]))
    folded, off = _train("mlp", 4, FOLD), _off("mlp", 4)
    _assert_same(folded, off)
    assert len(_reduced_sites(folded[3])) == 4


def test_a_bias_gradient_alone_is_reduced_bitwise(monkeypatch):
    """Where the weight gradient's all-reduce cannot be fused (here: its input faked as read
    twice), the bias gradient's still can: the weight gradients stay per replica."""
    from collections import Counter

    def readers(tensors):
        count = Counter(tensors)
        for t in list(count):
            count[t] += len(t.shape) == 2
        return count

    monkeypatch.setattr(fold_reduce, "Counter", readers)
    monkeypatch.setattr(fold_reduce, "FUSE_BYTES", 0)
    folded, off = _train("mlp", 4, FOLD), _off("mlp", 4)
    _assert_same(folded, off)
    sites = _reduced_sites(folded[3])
    assert len(sites) == 4 and all(s.reduced.kinds == {2: "mean"} for s in sites)


def test_each_all_reduce_of_the_folded_main_graph_has_one_case():
    """`fold.plan_reduces` decides every full all-reduce's `ReduceBy` once, and the
    emitted code follows it: the seed MLP's are all passed on from their LinearGrads
    (SITE), GPT's all made by one group call at its first (GROUP, one run)."""
    from popxl_core.ops.collectives.replicated import ALL_REDUCE

    for model, want in (("mlp", fold_reduce.ReduceBy.SITE), ("gpt", fold_reduce.ReduceBy.GROUP)):
        folded = _train(model, 2, FOLD, steps=1)[3]._replicas.fold
        main = folded.ir.main_graph._ops
        all_reduces = [op for op in main if op.opdef is ALL_REDUCE]
        assert all_reduces and set(folded.fold.reduce_by) == set(all_reduces)
        assert set(folded.fold.reduce_by.values()) == {want}
        groups = folded.main.source.count("RT.all_reduce_group")
        assert groups == len(folded.fold.runs) == (want is fold_reduce.ReduceBy.GROUP)
        if groups:
            (run,) = folded.fold.runs.values()
            assert run == [op for op in main if op in set(all_reduces)]


def test_small_gradients_of_many_ops_stay_in_one_group():
    """GPT's gradients (all under FUSE_BYTES) are all-reduced by one group call: none of its
    ops' all-reduces would make a run of their own."""
    folded, off = _train("gpt", 2, FOLD), _off("gpt", 2)
    _assert_same(folded, off)
    assert not _fused(folded[3])
    assert "RT.all_reduce_group" in folded[3]._replicas.fold.main.source


def test_row_blocks_cover_every_row_once():
    """`_row_blocks`: the whole gradient unless blocked; blocked, blocks of a multiple of 16
    rows (the last the rest) tiling the rows in order, each about `BLOCK_BYTES`."""
    for shape in [(512, 784), (512, 512), (10, 512), (1000, 3), (17, 4096), (1, 1)]:
        assert linear._row_blocks(shape, 4, False) == ((0, shape[0]),)
        blocks = linear._row_blocks(shape, 4, True)
        assert blocks[0][0] == 0 and blocks[-1][1] == shape[0]
        assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
        assert all((e - s) % 16 == 0 for s, e in blocks[:-1])
        size = shape[1] * 4
        assert all((e - s - 16) * size < linear.BLOCK_BYTES for s, e in blocks)
    assert len(linear._row_blocks((512, 784), 4, True)) == 3  # 1.6 MB in 3 blocks of 176 rows


@pytest.mark.parametrize("block_kib", [768, 100])
def test_the_row_blocked_variants_are_bitwise(linear_grad_fold, monkeypatch, block_kib):  # noqa: F811
    """The reduced kernel per block of the weight gradient's rows (the default's first
    variants): at 100 KiB every layer's gradient is 3-16 blocks, the last a short one."""
    monkeypatch.setattr(linear, "BLOCK_BYTES", block_kib * 2**10)
    good, replace = linear_grad_fold
    replace(reduced=tuple(k for k in good.reduced if k.keywords["blocked"]))
    assert len(good.reduced) == 8 and good.reduced[0].keywords["blocked"]
    folded, off = _train("mlp", 4, FOLD), _off("mlp", 4)
    _assert_same(folded, off)
    assert len(_reduced_sites(folded[3])) == 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("replicas", [2, 3, 4, 8, 16])
def test_divide_mean_gives_the_bits_of_a_division(dtype, replicas):
    """`divide_mean` (a multiplication by 1/R for a power of two R) against ``div_(R)``, bit
    for bit (tolerance 0), on normal, subnormal, signed-zero, infinite and NaN values."""
    info = torch.finfo(dtype)
    edge = [0.0, -0.0, info.tiny, -info.tiny, info.tiny / 3, info.max, -info.max, 1.0, -3.0]
    edge += [float("inf"), float("-inf"), float("nan"), info.smallest_normal * 1.5]
    values = torch.cat([torch.tensor(edge, dtype=torch.float64), torch.randn(4000) * 1e3])
    subnormal = torch.rand(2000, dtype=torch.float64) * info.tiny * 4
    values = torch.cat([values, subnormal, -subnormal]).to(dtype)
    want = values.clone().div_(replicas)
    got = divide_mean(values.clone(), replicas)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
