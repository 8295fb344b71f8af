"""Calls that crashed in the lowering (issue 34), against eager bit for bit (tolerance 0):
addmm/baddbmm with their operands by keyword (BLOOM's alibi), binary torch.max/min (ties
split the gradient in halves, as torch.maximum's backward does) and the named tuple of a
decomposed op (``torch.sort(x).values``)."""

import pytest
import torch
import torch.nn.functional as F

from .fx_cases import Fn, randn
from .fx_harness import check_lowering

CASES = {
    "baddbmm_keywords": (
        lambda a, b, c: torch.baddbmm(a, batch1=b, batch2=c, beta=0.5, alpha=2.0),
        (randn(2, 3, 5), randn(2, 3, 4, seed=1), randn(2, 4, 5, seed=2)),
    ),
    "addmm_keywords": (
        lambda a, b, c: torch.addmm(a, mat1=b, mat2=c),
        (randn(3, 5), randn(3, 4, seed=1), randn(4, 5, seed=2)),
    ),
    "addmm_input_keyword": (
        lambda a, b, c: torch.addmm(input=a, mat1=b, mat2=c, alpha=0.5),
        (randn(3, 5), randn(3, 4, seed=1), randn(4, 5, seed=2)),
    ),
    "max_min_binary": (
        lambda a, b: torch.max(a, b) * 2 + torch.min(a, b),
        (randn(3, 5), randn(3, 5, seed=1)),
    ),
    "max_min_other_keyword": (
        lambda a, b: torch.max(a, other=b) + a.min(other=b),
        (randn(3, 5), randn(3, 5, seed=1)),
    ),
    # equal operands: eager gives each half the gradient (a select gave one all of it)
    "max_ties": (lambda a, b: torch.max(a, b) * 3 + torch.min(b, a), (randn(3, 5), randn(3, 5))),
    "maximum_ties": (
        lambda a, b: torch.maximum(a, b) * 2 + torch.minimum(a, b),
        (randn(4), randn(4)),
    ),
    "sort_values_indices": (
        lambda a: torch.sort(a).values * 2 + torch.sort(a, dim=0, descending=True).indices,
        (randn(3, 5),),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_eager_bit_for_bit(name):
    fn, inputs = CASES[name]
    check_lowering(Fn(fn, len(inputs)), *inputs, rtol=0, atol=0)


def test_nan_wins_in_binary_max():
    x = torch.tensor([1.0, float("nan"), 3.0])
    y = torch.tensor([float("nan"), 2.0, 1.0])
    check_lowering(Fn(lambda a, b: torch.max(a, b), 2), x, y, rtol=0, atol=0, grad=False)


class _Experts(torch.nn.Module):
    """HF's grouped expert path in small: rows sorted by expert, tokens per expert counted by
    histc, each expert's rows times its (transposed, as HF passes it) weight by _grouped_mm."""

    def __init__(self, experts: int = 3, hidden: int = 8, out: int = 12) -> None:
        super().__init__()
        self.experts = experts
        self.weight = torch.nn.Parameter(randn(experts, out, hidden, seed=3))

    def forward(self, x, expert_ids):
        ids, perm = torch.sort(expert_ids)
        counts = torch.histc(ids.float(), bins=self.experts, min=0, max=self.experts - 1)
        offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
        y = torch._grouped_mm(x[perm], self.weight.transpose(-2, -1), offs=offsets)
        return y, counts


def test_histc_and_grouped_mm_match_eager_bit_for_bit():
    ids = torch.tensor([2, 0, 1, 2, 2, 0, 1, 1, 2, 0])
    check_lowering(_Experts(), randn(10, 8), ids, rtol=0, atol=0)


def test_grouped_mm_with_an_empty_group():
    ids = torch.tensor([2, 0, 2, 2, 0, 0])  # expert 1 gets no rows
    check_lowering(_Experts(), randn(6, 8), ids, rtol=0, atol=0)


def test_histc_forward():
    fn = lambda x: torch.histc(x, bins=5, min=-1.0, max=1.0)
    check_lowering(Fn(fn), randn(4, 6), rtol=0, atol=0, grad=False)


# eager runs these on a strided view (Qwen2-MoE's act(gate) of gate_up.chunk(2, -1)): torch's
# CPU loop rounds the scalar tail of a short row differently from its vectorised body
LAYOUT_SENSITIVE = {
    "silu": F.silu,
    "gelu_tanh": lambda g: F.gelu(g, approximate="tanh"),
    "sigmoid_method": lambda g: g.sigmoid(),
    "tanh": torch.tanh,
    "mish": F.mish,
}


@pytest.mark.parametrize("name", sorted(LAYOUT_SENSITIVE))
def test_activation_of_a_chunk_view_matches_eager_bit_for_bit(name):
    act = LAYOUT_SENSITIVE[name]

    def fn(x):
        gate, up = x.chunk(2, dim=-1)
        return act(gate) * up

    check_lowering(Fn(fn), randn(32, 32, scale=3.0), rtol=0, atol=0)
