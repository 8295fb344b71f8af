"""Reduction, softmax and cumsum lowerings against torch.

Tolerances: rtol 1e-5 / atol 1e-6 (float32 sums in another order); integer results (argmax,
indices, sums of bools) exactly."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from .fx_cases import Fn, randn, seq
from .fx_harness import check_lowering

CASES = {
    "sum_all": lambda x: x.sum(),
    "sum_dims_keepdim": lambda x: torch.sum(x, (0, 2), keepdim=True),
    "sum_bool": lambda x: (x > 0).sum(1),
    "mean_dim": lambda x: x.mean(-1),
    "mean_all": lambda x: torch.mean(x),
    "prod": lambda x: x.prod(1),
    "logsumexp": lambda x: torch.logsumexp(x, 1),
    "max_all": lambda x: x.max(),
    "max_dim_values": lambda x: x.max(1)[0],
    "max_dim_indices": lambda x: torch.max(x, 2, keepdim=True)[1],
    "max_dim_namedtuple": lambda x: x.max(dim=1).values,
    "min_dim": lambda x: torch.min(x, -1),
    "max_binary": lambda x: torch.max(x, x.flip(0)),
    "amax": lambda x: x.amax((1, 2)),
    "amin": lambda x: torch.amin(x, 0, keepdim=True),
    "argmax_all": lambda x: x.argmax(),
    "argmax_dim": lambda x: torch.argmax(x, 1, keepdim=True),
    "argmin": lambda x: x.argmin(-1),
    "var_default": lambda x: x.var(),
    "var_dim_biased": lambda x: x.var(1, unbiased=False),
    "var_correction_keepdim": lambda x: torch.var(x, (0, 2), correction=2, keepdim=True),
    "std_dim": lambda x: x.std(-1),
    "std_positional_unbiased": lambda x: torch.std(x, 1, False, True),
    "var_mean": lambda x: torch.var_mean(x, 1),
    "norm_default": lambda x: x.norm(),
    "norm_dim": lambda x: torch.norm(x, dim=1, keepdim=True),
    "norm_p1": lambda x: x.norm(1, -1),
    "norm_p3": lambda x: x.norm(3, 1),
    "norm_inf": lambda x: x.norm(float("inf"), 2),
    "vector_norm": lambda x: torch.linalg.vector_norm(x, dim=(1, 2)),
    "normalize": lambda x: F.normalize(x, dim=-1),
    "all": lambda x: (x > -3).all(),
    "any_dim": lambda x: torch.any(x > 1.5, 1),
    "softmax": lambda x: F.softmax(x, dim=-1),
    "softmax_method": lambda x: x.softmax(1),
    "log_softmax": lambda x: F.log_softmax(x, 1),
    "torch_log_softmax": lambda x: torch.log_softmax(x, dim=0),
    "cumsum": lambda x: x.cumsum(1),
    "topk_values": lambda x: x.topk(2, 1)[0],
    "topk_smallest_indices": lambda x: torch.topk(x, 3, largest=False).indices,
    "one_hot": lambda x: F.one_hot(x.argmax(-1), 6).float() * 2.0,
    "one_hot_inferred": lambda x: F.one_hot(x.argmax(-1)),
    "cumsum_neg": lambda x: torch.cumsum(x, -1),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_reduction(name):
    check_lowering(Fn(CASES[name]), randn(3, 4, 5), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "module", [nn.Softmax(1), nn.LogSoftmax(-1), nn.Softmax2d()], ids=lambda m: repr(m)
)
def test_softmax_module(module):
    check_lowering(seq(module), randn(2, 3, 4, 5), rtol=1e-5, atol=1e-6)


MEANS = {
    "dim_of_11": lambda x: x.mean(1),
    "dims_of_49": lambda x: x.mean((2, 3), keepdim=True),
    "all_of_3773": lambda x: x.mean(),
}


@pytest.mark.parametrize("name", sorted(MEANS))
def test_mean_gradient_is_eager_bit_for_bit(name):
    """Eager's mean_backward divides the expanded gradient by the count; times 1 / n rounds
    otherwise where 1 / n is inexact (issue 34)."""
    check_lowering(Fn(MEANS[name]), randn(7, 11, 7, 7), rtol=0.0, atol=0.0)
