"""matmul-family, einsum and embedding lowerings against torch.

Tolerances: rtol 1e-5 / atol 1e-5 (float32 dot products of up to 6 terms in another order);
embedding forward exactly."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from .fx_cases import Fn, randn, seq
from .fx_harness import check_lowering

PAIRS = {
    "matmul_batched": (lambda a, b: a @ b, (2, 3, 4), (4, 5)),
    "matmul_broadcast": (lambda a, b: torch.matmul(a, b), (2, 1, 3, 4), (3, 4, 2)),
    "matmul_vec": (lambda a, b: a.matmul(b), (3, 4), (4,)),
    "mm": (lambda a, b: torch.mm(a, b), (3, 4), (4, 5)),
    "bmm": (lambda a, b: a.bmm(b), (2, 3, 4), (2, 4, 5)),
    "outer": (lambda a, b: torch.outer(a, b), (3,), (4,)),
    "einsum_matmul": (lambda a, b: torch.einsum("bij,jk->bik", a, b), (2, 3, 4), (4, 5)),
    "einsum_attention": (
        lambda a, b: torch.einsum("bhqd,bhkd->bhqk", a, b),
        (2, 3, 4, 5),
        (2, 3, 6, 5),
    ),
    "einsum_implicit_out": (lambda a, b: torch.einsum("ij,kj", a, b), (3, 4), (5, 4)),
    "einsum_ellipsis": (
        lambda a, b: torch.einsum("...ij,...jk->...ik", a, b),
        (2, 3, 4),
        (2, 4, 5),
    ),
    "einsum_sum_own_index": (lambda a, b: torch.einsum("ijk,kl->l", a, b), (2, 3, 4), (4, 5)),
    "einsum_outer_transpose": (lambda a, b: torch.einsum("i,j->ji", a, b), (3,), (4,)),
    "einsum_list_operands": (lambda a, b: torch.einsum("bn,anm->bam", [a, b]), (2, 3), (4, 3, 5)),
}


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_matmul_family(name):
    fn, sa, sb = PAIRS[name]
    check_lowering(Fn(fn, 2), randn(*sa), randn(*sb, seed=1), rtol=1e-5, atol=1e-5)


def test_einsum_three_operands_and_transposed_output():
    fn = lambda a, b, c: torch.einsum("ij,jk,kl->li", a, b, c)
    check_lowering(
        Fn(fn, 3), randn(3, 4), randn(4, 5, seed=1), randn(5, 2, seed=2), rtol=1e-5, atol=1e-5
    )


def test_einsum_trace_is_not_supported():
    with pytest.raises(NotImplementedError, match="diagonal"):
        check_lowering(Fn(lambda a: torch.einsum("ii->i", a)), randn(3, 3))


@pytest.mark.parametrize(
    "name,fn",
    [
        ("addmm", lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0)),
        ("baddbmm", lambda c, a, b: torch.baddbmm(c[None], a[None], b[None], alpha=0.5)),
    ],
)
def test_addmm(name, fn):
    check_lowering(
        Fn(fn, 3), randn(3, 5, seed=2), randn(3, 4), randn(4, 5, seed=1), rtol=1e-5, atol=1e-5
    )


def test_linear_and_identity_modules():
    torch.manual_seed(0)
    check_lowering(
        seq(nn.Linear(4, 3), nn.Identity(), nn.Linear(3, 2, bias=False)),
        randn(2, 5, 4),
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.parametrize("padding_idx", [None, 0, -2])
def test_embedding_module(padding_idx):
    torch.manual_seed(0)
    indices = torch.tensor([[0, 3, 5, 3], [4, 0, 1, 1]])
    check_lowering(
        seq(nn.Embedding(6, 3, padding_idx=padding_idx)),
        indices,
        rtol=0,
        atol=0,
        grad_rtol=1e-6,
        grad_atol=1e-6,
    )


def test_embedding_function():
    fn = lambda i, w: F.embedding(i, w, padding_idx=1)
    check_lowering(
        Fn(fn, 2),
        torch.tensor([1, 2, 1, 0]),
        randn(4, 3),
        rtol=0,
        atol=0,
        grad_rtol=1e-6,
        grad_atol=1e-6,
    )
