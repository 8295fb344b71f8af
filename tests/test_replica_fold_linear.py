"""Folded replicas' ``Linear`` (sim/fold_site.py): where one GEMM over all replicas' rows
gives other bits than each replica's own GEMM (MKL picks kernels per shape and CPU: on an
Intel Xeon host the seed MLP's forward layers did), the batched form (one GEMM a replica,
in one call) still folds the site."""

from __future__ import annotations

import pytest
import torch

from popxl_core.ops.linear import _FOLDED_FORWARD, LINEAR, _kernel
from tests.test_replica_folding import FOLD, _assert_same, _chosen, _off, _train, fold_fields

_BATCHED = _FOLDED_FORWARD[-1]


def _each_replica(x, w, bias, fold, replicas):
    parts = [_kernel(part, w, *bias, fold=fold) for part in x.chunk(replicas)]
    return torch.cat(parts)


@pytest.mark.parametrize(
    "shape, bias, fold",
    [
        ((12, 784), True, "addmm"),
        ((12, 5, 16), True, "addmm"),
        ((12, 16), False, "addmm"),
        ((12, 5, 16), True, "mm"),
    ],
)
def test_the_batched_forward_is_each_replicas_bits(shape, bias, fold):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g)
    w = torch.randn(24, shape[-1], generator=g)
    b = (torch.randn(24, generator=g),) if bias else ()
    for replicas in (2, 3, 4):
        got = _BATCHED((x, w, *b), replicas, frozenset(), None, fold=fold)
        want = _each_replica(x, w, b, fold, replicas)
        assert got.shape == want.shape and torch.equal(got, want)


@pytest.fixture
def one_gemm_off():
    """Linear's one-GEMM form one ulp off (as a CPU whose GEMM kernels differ by rows)."""
    fold = fold_fields(LINEAR)
    good, replace = next(fold)
    one_gemm = good.kernels[0]

    def off(*args, **attrs):
        y = one_gemm(*args, **attrs)
        return torch.nextafter(y, y + 1)

    replace(kernels=(off, *good.kernels[1:]))
    yield
    next(fold, None)


def test_a_one_gemm_form_with_other_bits_takes_the_batched_form(one_gemm_off):
    folded, off = _train("mlp", 2, FOLD), _off("mlp", 2)
    _assert_same(folded, off)
    assert _chosen(folded[3], "Linear") == {"folded"}
