"""Bit for bit with eager where rounding depends on more than the values (rtol=atol=0):

- the divisor's gradient of ``a / b`` (DivBackward: ``-g * ((a / b) / b)``);
- a broadcast operand's gradient summed over several axes at once (autograd's ``sum_to``);
- ``q @ k.transpose(-2, -1)``: BLAS and the backward round by the operands' memory layout;
- the ATen fallback (torchvision's ``torch.fx.wrap``-ed functions): the vector norm kept
  whole (its core decomposition is 1 ulp off), a division of a strided view;
- torchvision's Swin V2 attention, which met all of these.
"""

import copy

import torch
import torch.nn.functional as F
from torch import nn

import popxl_fx
from popxl_fx import Options


class _Fn(nn.Module):
    def __init__(self, fn, param_shape=None):
        super().__init__()
        self.fn = fn
        if param_shape is not None:
            gen = torch.Generator().manual_seed(2)
            self.p = nn.Parameter(torch.randn(*param_shape, generator=gen))

    def forward(self, a, b):
        return self.fn(self, a, b)


@torch.fx.wrap
def _wrapped_normalize_qk(x):
    """Heads sliced from one qkv tensor, as torchvision's Swin V2 does (a fallback call)."""
    qkv = x.reshape(4, 16, 2, 2, 8).permute(2, 0, 3, 1, 4)
    q, k = qkv[0], qkv[1]
    return F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)


def _grads(module, args):
    args = [a.detach().clone().requires_grad_() for a in args]
    out = module(*args)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(5)))
    params = [p.grad for p in module.parameters()]
    return [out.detach(), *(a.grad for a in args), *params]


def _same_as_eager(module, *args):
    eager = _grads(copy.deepcopy(module), args)
    sim = _grads(popxl_fx.compile(copy.deepcopy(module), Options(device="cpu")), args)
    for got, want in zip(sim, eager):
        assert torch.equal(got, want), (got - want).abs().max()


def _rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_divisor_gradient():
    _same_as_eager(_Fn(lambda m, a, b: a / b), _rand(4, 16, seed=0), _rand(4, 16, seed=1) + 3)


def test_broadcast_gradient_over_several_axes():
    _same_as_eager(_Fn(lambda m, a, b: a * m.p + b, (2, 1, 1)), _rand(8, 2, 16, 16, seed=0),
                   _rand(8, 2, 16, 16, seed=1))  # fmt: skip


def test_matmul_with_a_transposed_view():
    _same_as_eager(_Fn(lambda m, q, k: q @ k.transpose(-2, -1)), _rand(2, 2, 16, 8, seed=0),
                   _rand(2, 2, 16, 8, seed=1))  # fmt: skip


def test_fallback_normalize_of_sliced_heads():
    _same_as_eager(_Fn(lambda m, x, y: _wrapped_normalize_qk(x) * y), _rand(4, 16, 32, seed=0),
                   _rand(4, 2, 16, 16, seed=1))  # fmt: skip


def test_swin_v2_attention():
    from torchvision.models.swin_transformer import ShiftedWindowAttentionV2

    torch.manual_seed(0)
    attn = ShiftedWindowAttentionV2(16, [4, 4], [2, 2], 2).eval()
    x = _rand(2, 8, 8, 16, seed=1)
    eager = _grads(copy.deepcopy(attn), [x])
    sim = _grads(popxl_fx.compile(copy.deepcopy(attn), Options(device="cpu")), [x])
    for got, want in zip(sim, eager):
        assert torch.equal(got, want), (got - want).abs().max()
