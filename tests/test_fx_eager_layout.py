"""Bit for bit with eager where rounding depends on more than the values (rtol=atol=0):

- the divisor's gradient of ``a / b`` (DivBackward: ``-g * ((a / b) / b)``);
- a broadcast operand's gradient summed over several axes at once (autograd's ``sum_to``);
- ``q @ k.transpose(-2, -1)``: BLAS and the backward round by the operands' memory layout;
- the ATen fallback (torchvision's ``torch.fx.wrap``-ed functions): the vector norm kept
  whole (its core decomposition is 1 ulp off), a division of a strided view;
- torchvision's Swin V2 attention, which met all of these;
- an elementwise result that follows a permuted input's layout (torch's choice) though the
  simulator writes it into a dead temporary's storage (``out=`` reuse), then a reduction
  over it (MaxViT's grid attention residual, stochastic depth, then the head's pooling).
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


def test_reused_storage_keeps_a_permuted_inputs_layout():
    # the add writes into the mul's dead output in the simulator; eager's result is laid out
    # like the permuted ``a``, and the pooling sums in that order
    _same_as_eager(
        _Fn(lambda m, a, b: F.adaptive_avg_pool2d(a.permute(0, 3, 1, 2) + b * m.p, 1), (16, 1, 1)),
        _rand(2, 7, 7, 16, seed=0),
        _rand(2, 16, 7, 7, seed=1),
    )


def test_maxvit_stochastic_depth_two_steps():
    """A small MaxViT in train mode (stochastic depth drawn as eager's) after 2 SGD steps."""
    from torchvision.models.maxvit import MaxVit

    torch.manual_seed(0)
    model = MaxVit(
        input_size=(56, 56),
        stem_channels=8,
        partition_size=7,
        block_channels=[8, 16],
        block_layers=[1, 1],
        head_dim=4,
        stochastic_depth_prob=0.2,
        num_classes=10,
    )
    x, y = _rand(2, 3, 56, 56, seed=1), torch.tensor([3, 7])
    twin = copy.deepcopy(model).train()
    model.train()
    eager_opt = torch.optim.SGD(twin.parameters(), lr=0.01, momentum=0.9)
    states = []
    for _ in range(2):
        states.append(torch.get_rng_state())
        eager_opt.zero_grad()
        F.cross_entropy(twin(x), y).backward()
        eager_opt.step()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    trainer = popxl_fx.training_model(model, opt, F.cross_entropy, Options(device="cpu"))
    for state in states:
        torch.set_rng_state(state)  # the same stochastic depth draws as eager's step
        trainer(x, y)
    for (name, got), want in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(got.detach(), want.detach()), (name, (got - want).abs().max())
