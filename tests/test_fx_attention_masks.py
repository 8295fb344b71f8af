"""Masked attention equals eager bit for bit (rtol=atol=0): F.scaled_dot_product_attention and
nn.MultiheadAttention with each kind of mask (bool and float attn_mask, key_padding_mask,
is_causal with a mask), in inference and over 2 AdamW steps in train mode, attention dropout
included (drawn from torch's generator, the default ``Options(rng="torch")``).

AdamW divides by sqrt(v) + eps, which turns a last-bit difference in a near-zero gradient
into a visible one: this is the comparison the composite attention failed (~1e-6).
"""

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import popxl_fx
from popxl_fx.testing import assert_matches_eager

B, H, L, E = 2, 2, 5, 8
EXACT = dict(rtol=0.0, atol=0.0)


def _masks() -> dict:
    g = torch.Generator().manual_seed(5)
    keep = torch.rand(L, L, generator=g) > 0.4
    keep[:, 0] = True  # no fully masked row (eager gives NaN there)
    pad = torch.zeros(B, L, dtype=torch.bool)
    pad[0, -2:] = True
    causal = torch.triu(torch.ones(L, L, dtype=torch.bool), 1)
    return {
        "bool": keep,
        "float": torch.randn(B, H, L, L, generator=g),
        "pad": pad,
        "causal": causal,
    }


class SDPANet(nn.Module):
    """Projections and SDPA with one mask kind (bool: True takes part; float: added)."""

    def __init__(self, kind: str, dropout: float = 0.0):
        super().__init__()
        self.qkv, self.out, self.kind, self.p = nn.Linear(E, 3 * E), nn.Linear(E, E), kind, dropout

    def forward(self, x, mask):
        q, k, v = (t.view(B, L, H, E // H).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        p = self.p if self.training else 0.0
        if self.kind == "causal":
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        elif self.kind == "pad":  # (N, S) -> (N, 1, 1, S), True takes part
            y = F.scaled_dot_product_attention(q, k, v, ~mask[:, None, None, :], p)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        return self.out(y.transpose(1, 2).reshape(B, L, E))


class MHANet(nn.Module):
    def __init__(self, kind: str, need_weights: bool, dropout: float = 0.0):
        super().__init__()
        self.attn = nn.MultiheadAttention(E, H, dropout=dropout, batch_first=True)
        self.kind, self.need_weights = kind, need_weights

    def forward(self, x, mask):
        kw = dict(need_weights=self.need_weights)
        if self.kind == "pad":
            kw["key_padding_mask"] = mask
        elif self.kind == "causal":  # torch's is_causal needs the mask too
            kw.update(attn_mask=mask, is_causal=True)
        elif self.kind == "float":
            kw["attn_mask"] = mask.reshape(B * H, L, L)
        else:
            kw["attn_mask"] = ~mask  # MultiheadAttention: True = not allowed
        return self.attn(x, x, x, **kw)[0]


def _case(net: str, kind: str, need_weights: bool = False, dropout: float = 0.0):
    torch.manual_seed(0)
    model = SDPANet(kind, dropout) if net == "sdpa" else MHANet(kind, need_weights, dropout)
    x = torch.randn(B, L, E, generator=torch.Generator().manual_seed(1))
    return model, (x, _masks()[kind])


def _loss(y, target):
    return F.cross_entropy(y.reshape(B * L, E), target)


KINDS = ["bool", "float", "pad", "causal"]
NETS = [("sdpa", False), ("mha", False), ("mha", True)]


def _id(net, weights):
    return f"{net}{'-weights' if weights else ''}"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("net,weights", NETS, ids=[_id(*n) for n in NETS])
def test_masked_attention_inference_equals_eager(net, weights, kind):
    model, inputs = _case(net, kind, weights)
    model.eval()
    sim = popxl_fx.inference_model(model)
    # eager in eval under no_grad takes MultiheadAttention's inference fast path
    # (torch._native_multi_head_attention), a kernel of its own that popxl_fx does not run
    with torch.no_grad(), _mha_fastpath(False):
        assert torch.equal(sim(*inputs), model(*inputs))


@contextlib.contextmanager
def _mha_fastpath(enabled: bool):
    before = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(enabled)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(before)


@pytest.mark.parametrize("dropout", [0.0, 0.3])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("net,weights", NETS, ids=[_id(*n) for n in NETS])
def test_masked_attention_trains_like_eager(net, weights, kind, dropout):
    model, inputs = _case(net, kind, weights, dropout)
    target = torch.randint(0, E, (B * L,), generator=torch.Generator().manual_seed(2))
    torch.manual_seed(3)  # the dropout masks: the same draws in both runs
    errors = assert_matches_eager(
        model,
        inputs,
        targets=target,
        loss_fn=_loss,
        optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3),
        steps=2,
        **EXACT,
    )
    assert max(errors.values()) == 0.0


class _LearnedBias(nn.Module):
    """A float mask computed from a parameter (T5's position bias): it requires grad in eager
    with autograd on (torch runs SDPA's math kernel) and not under no_grad (the flash kernel)."""

    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(
            torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(3))
        )

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias * 2.0)


def test_inference_follows_the_callers_grad_mode():
    net = _LearnedBias()
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 4, 8, 16, generator=gen) for _ in range(3))
    with_grad = net(q, k, v).detach()
    with torch.no_grad():
        no_grad = net(q, k, v)
    assert not torch.equal(with_grad, no_grad)  # eager's two kernels: the case is real
    sim = popxl_fx.inference_model(net)
    with torch.no_grad():
        assert torch.equal(sim(q, k, v), no_grad)  # rtol=atol=0
    assert torch.equal(sim(q, k, v), with_grad)
