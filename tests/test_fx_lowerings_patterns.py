"""Common user-model idioms, lowered end to end against torch: a minGPT-style causal
self-attention block (mask buffer sliced and compared, masked_fill with -inf, view/transpose
of heads), an LSTM classifier reading the last step, nn.Transformer traced through, and a
small CNN with functional calls.

Tolerances: rtol 1e-5 / atol 1e-5."""

import math

import torch
import torch.nn.functional as F
from torch import nn

from .fx_cases import randn
from .fx_harness import check_lowering

TOL = dict(rtol=1e-5, atol=1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd=16, n_head=4, block=8):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head = n_head
        self.register_buffer("bias", torch.tril(torch.ones(block, block)).view(1, 1, block, block))

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(c, dim=2)
        k = k.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        q = q.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        v = v.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.c_proj(y)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(16), nn.LayerNorm(16)
        self.attn = CausalSelfAttention()
        self.mlp = nn.Sequential(nn.Linear(16, 64), nn.GELU(approximate="tanh"), nn.Linear(64, 16))

    def forward(self, idx):
        pos = torch.arange(0, idx.size(1), dtype=torch.long)
        x = self.wte(idx) + self.wpe(pos)
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return self.head(x)


def test_gpt_style_block():
    torch.manual_seed(0)
    model = Block()
    model.wte, model.wpe, model.head = nn.Embedding(11, 16), nn.Embedding(8, 16), nn.Linear(16, 11)
    idx = torch.randint(0, 11, (2, 6), generator=torch.Generator().manual_seed(1))
    check_lowering(model, idx, **TOL)


class LSTMClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 8, padding_idx=0)
        self.lstm = nn.LSTM(8, 12, num_layers=2, batch_first=True)
        self.fc = nn.Linear(12, 3)

    def forward(self, tokens, labels):
        out, (h, c) = self.lstm(self.emb(tokens))
        logits = self.fc(out[:, -1, :]) + self.fc(h[-1])
        return F.cross_entropy(logits, labels)


def test_lstm_classifier_with_loss():
    torch.manual_seed(0)
    tokens = torch.randint(0, 20, (3, 7), generator=torch.Generator().manual_seed(2))
    check_lowering(LSTMClassifier(), tokens, torch.tensor([0, 2, 1]), **TOL)


def test_nn_transformer_is_traced_through():
    torch.manual_seed(0)
    model = nn.Transformer(16, 2, 1, 1, 32, dropout=0.0, batch_first=True)
    mask = nn.Transformer.generate_square_subsequent_mask(4)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.t = model

        def forward(self, src, tgt):
            return self.t(src, tgt, tgt_mask=mask)

    check_lowering(Net(), randn(2, 5, 16), randn(2, 4, 16, seed=1), **TOL)


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(1, 4, 3, padding=1), nn.Conv2d(4, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 3 * 3, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.avg_pool2d(F.silu(self.bn(self.c2(x))), 2, ceil_mode=True)
        return F.log_softmax(self.fc(x.view(x.size(0), -1)), dim=1)


def test_small_cnn_train_mode():
    torch.manual_seed(0)
    check_lowering(SmallCNN(), randn(4, 1, 14, 14), **TOL)
