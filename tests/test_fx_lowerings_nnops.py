"""cumprod, cumsum(out=), eval RReLU and batch norm lowerings against torch (torch's own kernels:
tolerance 0)."""

import pytest
import torch
from torch import nn

import popxl_fx

from .fx_cases import Fn, randn
from .fx_harness import check_lowering


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cumprod_forward_and_gradient_are_eager(dim):
    check_lowering(Fn(lambda x: torch.cumprod(x, dim)), randn(3, 4, 5), rtol=0.0, atol=0.0)


def test_cumprod_method():
    check_lowering(Fn(lambda x: x.cumprod(1)), randn(3, 4), rtol=0.0, atol=0.0)


@pytest.mark.parametrize("src", [torch.float32, torch.int32], ids=str)
@pytest.mark.parametrize("dest", [torch.float32, torch.int32], ids=str)
def test_cumsum_out_sums_in_the_out_dtype(src, dest):
    """torch.cumsum(x, d, out=t) computes as dtype=t.dtype (float -> int truncates first)."""

    def fn(x):
        res = torch.empty(x.shape).to(dest)
        return torch.cumsum(x.detach().to(src), -1, out=res)

    check_lowering(Fn(fn), randn(2, 6) * 3, rtol=0.0, atol=0.0, grad=False)


def test_rrelu_in_eval_is_eagers_leaky_relu():
    check_lowering(nn.Sequential(nn.RReLU()).eval(), randn(4, 50), rtol=0.0, atol=0.0)


def _untracked_with_stats() -> nn.Module:
    """BatchNorm without tracking whose buffers were set by hand (PopTorch's norms test):
    eager normalises with those statistics in eval, with the batch's in training."""
    bn = nn.BatchNorm1d(4, affine=False, track_running_stats=False)
    bn._buffers["running_mean"] = torch.randn(4)
    bn._buffers["running_var"] = torch.rand(4) + 0.5
    return nn.Sequential(bn)


@pytest.mark.parametrize("training", [False, True])
def test_untracked_batch_norm_uses_set_statistics_in_eval(training):
    torch.manual_seed(0)
    check_lowering(_untracked_with_stats().train(training), randn(3, 4, 5), rtol=1e-6, atol=1e-6)


def test_batch_norm_half_input_float_parameters_is_eagers_mixed_kernel():
    """The gradient of the mixed op is checked by the op table (this harness's cotangents are
    float32)."""
    torch.manual_seed(0)
    bn = nn.Sequential(nn.BatchNorm1d(6))
    check_lowering(bn, randn(8, 6).half(), rtol=0.0, atol=0.0, grad=False)


class _Accumulates(nn.Module):
    """Updates a tensor it makes in forward in place (PopTorch's norm-in-loop test): a new
    tensor every call, so no hidden state."""

    def __init__(self) -> None:
        super().__init__()
        self.e = nn.Parameter(torch.randn(4, 3))

    def forward(self, x):
        total = torch.zeros(4)
        for _ in range(3):
            total += torch.norm(self.e * x, dim=-1)
        return total


def test_inplace_update_of_a_tensor_made_in_forward_is_no_hidden_state():
    torch.manual_seed(0)
    model, x = _Accumulates(), torch.randn(4, 3)
    run = popxl_fx.inference_model(model)
    for _ in range(2):  # the constant the program reads stays zeros
        assert torch.equal(run(x), model(x).detach())
