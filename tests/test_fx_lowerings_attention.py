"""Attention lowerings against torch: scaled_dot_product_attention, nn.MultiheadAttention
and the transformer encoder/decoder layers and stacks, forward and gradient.

Bit for bit (rtol=atol=0): SDPA is one op whose kernel is torch's own call, and
MultiheadAttention runs torch's own sequence. One exception, stated where it is: with
separate k/v projection weights (kdim/vdim) and need_weights, the key bias gradient, which is
mathematically zero (softmax is shift invariant), is rounding noise that eager reduces over a
strided gradient in another order (5e-8)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from .fx_cases import Fn, randn
from .fx_harness import check_lowering

TOL = dict(rtol=0.0, atol=0.0)
B, H, L, S, D = 2, 3, 4, 5, 6
PAD = torch.tensor([[False, False, False, True, True], [False, True, False, False, False]])


def _q_k_v():
    return randn(B, H, L, D), randn(B, H, S, D, seed=1), randn(B, H, S, D, seed=2)


SDPA = {
    "plain": lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
    "scale": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=0.3),
    "causal": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    "float_mask": lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, attn_mask=(q[:, :, :, :1] * k[:, :, :, 0].unsqueeze(-2)).detach()
    ),
}


@pytest.mark.parametrize("name", sorted(SDPA))
def test_sdpa(name):
    check_lowering(Fn(SDPA[name], 3), *_q_k_v(), **TOL)


def test_sdpa_bool_mask_and_gqa():
    class Net(nn.Module):
        def forward(self, q, k, v, mask):
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            b = F.scaled_dot_product_attention(q, k[:, :1], v[:, :1], enable_gqa=True)
            return a + b

    mask = torch.rand(L, S, generator=torch.Generator().manual_seed(3)) > 0.3
    mask[:, 0] = True  # no fully masked row (torch gives NaN there)
    check_lowering(Net(), *_q_k_v(), mask, **TOL)


class MHA(nn.Module):
    def __init__(self, **kwargs):
        super().__init__()
        self.attn = nn.MultiheadAttention(12, 3, **kwargs)
        self.kwargs = {}

    def forward(self, q, kv, pad):
        out, weights = self.attn(q, kv, kv, key_padding_mask=pad, **self.kwargs)
        return (out, weights) if self.kwargs["need_weights"] else out


def _mha(batch_first=True, need_weights=True, average=True, **kwargs):
    torch.manual_seed(0)
    m = MHA(batch_first=batch_first, **kwargs)
    m.kwargs = dict(need_weights=need_weights, average_attn_weights=average)
    return m


@pytest.mark.parametrize(
    "name,kwargs",
    [
        ("batch_first_weights", dict()),
        ("seq_first_no_weights", dict(batch_first=False, need_weights=False)),
        ("per_head_weights", dict(average=False)),
        ("no_bias", dict(bias=False)),
        ("kdim_vdim", dict(kdim=7, vdim=7)),
    ],
)
def test_multihead_attention(name, kwargs):
    model = _mha(**kwargs)
    q, kv = randn(B, L, 12), randn(B, S, 7 if "kdim" in kwargs else 12, seed=1)
    if not kwargs.get("batch_first", True):
        q, kv = q.transpose(0, 1).contiguous(), kv.transpose(0, 1).contiguous()
    grad_tol = dict(grad_rtol=0.0, grad_atol=1e-7) if "kdim" in kwargs else {}
    check_lowering(model, q, kv, PAD, **TOL, **grad_tol)


def test_multihead_attention_masks():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(12, 3, batch_first=True)

        def forward(self, x, bool_mask, float_mask):
            a = self.attn(x, x, x, attn_mask=bool_mask, need_weights=False)[0]
            b = self.attn(x, x, x, attn_mask=float_mask)[1]
            return a, b

    torch.manual_seed(0)
    causal = torch.triu(torch.ones(L, L, dtype=torch.bool), 1)  # True = not allowed
    check_lowering(Net(), randn(B, L, 12), causal, randn(B * 3, L, L, seed=4), **TOL)


def test_multihead_attention_unbatched():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Identity())
    model.attn = nn.MultiheadAttention(12, 4)
    fn = lambda x: model.attn(x, x, x)
    net = Fn(fn)
    net.attn = model.attn
    check_lowering(net, randn(L, 12), **TOL)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_transformer_encoder_layer(norm_first, activation):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.TransformerEncoderLayer(
                12,
                3,
                20,
                dropout=0.0,
                activation=activation,
                batch_first=True,
                norm_first=norm_first,
            )

        def forward(self, x, mask, pad):
            return self.layer(x, src_mask=mask, src_key_padding_mask=pad)

    torch.manual_seed(0)
    mask = torch.triu(torch.full((S, S), float("-inf")), 1)
    check_lowering(Net(), randn(B, S, 12), mask, PAD, **TOL)


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_decoder_layer(norm_first):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.TransformerDecoderLayer(
                12,
                3,
                20,
                dropout=0.0,
                activation=nn.GELU(),
                batch_first=True,
                norm_first=norm_first,
            )

        def forward(self, x, memory, mask):
            return self.layer(x, memory, tgt_mask=mask)

    torch.manual_seed(0)
    mask = torch.triu(torch.ones(L, L, dtype=torch.bool), 1)
    check_lowering(Net(), randn(B, L, 12), randn(B, S, 12, seed=1), mask, **TOL)


def test_transformer_encoder_and_decoder_stacks():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            enc = nn.TransformerEncoderLayer(12, 3, 20, dropout=0.0)
            dec = nn.TransformerDecoderLayer(12, 3, 20, dropout=0.0)
            self.encoder = nn.TransformerEncoder(
                enc, 2, norm=nn.LayerNorm(12), enable_nested_tensor=False
            )
            self.decoder = nn.TransformerDecoder(dec, 2)

        def forward(self, src, tgt, pad):
            memory = self.encoder(src, src_key_padding_mask=pad)
            return self.decoder(tgt, memory, memory_key_padding_mask=pad)

    torch.manual_seed(0)
    check_lowering(Net(), randn(S, B, 12), randn(L, B, 12, seed=1), PAD, **TOL)
