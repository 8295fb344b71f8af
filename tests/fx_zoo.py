"""The models of popxl_fx's Done-when list, at small sizes, with their inputs and losses.

Each entry builds (model, inputs, targets, loss_fn); models are seeded, so two builds are
identical. Dropout is set to p=0 (exact comparisons need the same masks, and the simulator's
random stream is not torch's); everything else is the model as written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ZOO", "Case", "TORCHVISION", "OPTIMIZERS", "train_against_eager"]


@dataclass
class Case:
    model: nn.Module
    inputs: tuple
    targets: torch.Tensor | None
    loss_fn: Callable | None


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def no_dropout(model: nn.Module) -> nn.Module:
    """Dropout and stochastic depth off (p=0), in train mode too."""
    for m in model.modules():
        if isinstance(m, nn.Dropout) or type(m).__name__ == "StochasticDepth":
            m.p = 0.0
        if isinstance(m, nn.MultiheadAttention):
            m.dropout = 0.0
    return model


# small hand-written models ---------------------------------------------------------------
class SeedMLP(nn.Module):
    """The addons seed's network: 784-512-512-512-10 with gelu."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(784, 512), nn.Linear(512, 512)
        self.fc3, self.fc4 = nn.Linear(512, 512), nn.Linear(512, 10)

    def forward(self, x):
        x = x.reshape(-1, 28 * 28)
        x = F.gelu(self.fc1(x))
        x = F.gelu(self.fc2(x))
        x = F.gelu(self.fc3(x))
        return self.fc4(x)


def small_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
        nn.Flatten(), nn.Linear(16 * 4 * 4, 10),
    )  # fmt: skip


class LSTMClassifier(nn.Module):
    def __init__(self, features=12, hidden=24, classes=10) -> None:
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


class DecoderBlock(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(
            nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d)
        )

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A 4-layer GPT-style decoder with causal attention; forward returns (loss, logits)."""

    def __init__(self, vocab=64, block=16, d=32, heads=4, layers=4) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(1, block, d) * 0.02)
        self.blocks = nn.Sequential(*[DecoderBlock(d, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.blocks(self.tok(idx) + self.pos[:, :t])
        logits = self.head(self.ln_f(x))
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return loss, logits


class BERT(nn.Module):
    """A BERT-style encoder: nn.Embedding + nn.TransformerEncoder, mean-pooled classifier."""

    def __init__(self, vocab=64, block=16, d=32, heads=4, layers=2, classes=10) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(1, block, d) * 0.02)
        layer = nn.TransformerEncoderLayer(
            d, heads, dim_feedforward=64, dropout=0.0, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, classes)

    def forward(self, idx):
        x = self.encoder(self.tok(idx) + self.pos[:, : idx.shape[1]])
        return self.head(x.mean(dim=1))


def _seed_mlp() -> Case:
    torch.manual_seed(0)
    x = torch.randn(8, 1, 28, 28, generator=_gen(1))
    return Case(SeedMLP(), (x,), torch.randint(0, 10, (8,), generator=_gen(2)), F.cross_entropy)


def _cnn() -> Case:
    torch.manual_seed(0)
    x = torch.randn(4, 1, 28, 28, generator=_gen(1))
    return Case(
        small_cnn(), (x,), torch.randint(0, 10, (4,), generator=_gen(2)), nn.CrossEntropyLoss()
    )


def _lstm() -> Case:
    torch.manual_seed(0)
    x = torch.randn(4, 6, 12, generator=_gen(1))
    return Case(
        LSTMClassifier(), (x,), torch.randint(0, 10, (4,), generator=_gen(2)), F.cross_entropy
    )


def _gpt() -> Case:
    torch.manual_seed(0)
    idx = torch.randint(0, 64, (2, 16), generator=_gen(1))
    targets = torch.randint(0, 64, (2, 16), generator=_gen(2))
    return Case(GPT(), (idx, targets), None, None)


def _bert() -> Case:
    torch.manual_seed(0)
    idx = torch.randint(0, 64, (2, 16), generator=_gen(1))
    return Case(BERT(), (idx,), torch.randint(0, 10, (2,), generator=_gen(2)), F.cross_entropy)


def _torchvision(name: str, **kwargs) -> Callable[[], Case]:
    def build() -> Case:
        import torchvision

        torch.manual_seed(0)
        model = no_dropout(getattr(torchvision.models, name)(num_classes=10, **kwargs))
        x = torch.randn(4, 3, 64, 64, generator=_gen(1))
        return Case(model, (x,), torch.randint(0, 10, (4,), generator=_gen(2)), F.cross_entropy)

    return build


ZOO: dict[str, Callable[[], Case]] = {
    "seed_mlp": _seed_mlp,
    "small_cnn": _cnn,
    "lstm": _lstm,
    "gpt": _gpt,
    "bert": _bert,
}
TORCHVISION: dict[str, Callable[[], Case]] = {
    "resnet18": _torchvision("resnet18"),
    "mobilenet_v2": _torchvision("mobilenet_v2"),
    "vgg11_bn": _torchvision("vgg11_bn"),
    "efficientnet_b0": _torchvision("efficientnet_b0"),
    "vit_b_16": _torchvision("vit_b_16", image_size=64),
}


# the optimizers of the Done-when list; AdamW's eps=1e-6 is explained in test_fx_models.py
OPTIMIZERS: dict[str, Callable] = {
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-3, eps=1e-6),
}


def train_against_eager(
    build: Callable[[], Case], optimizer: str, via: str, *, rtol: float, atol: float, options=None
) -> dict:
    """3 steps of ``optimizer`` on the simulator (``via`` training_model or compile) against
    eager PyTorch with `popxl_fx.testing.assert_matches_eager`; returns its max errors."""
    from popxl_fx.testing import assert_matches_eager

    case = build()
    return assert_matches_eager(
        case.model,
        case.inputs,
        targets=case.targets,
        loss_fn=case.loss_fn,
        optimizer=OPTIMIZERS[optimizer],
        steps=3,
        options=options,
        rtol=rtol,
        atol=atol,
        via=via,
    )
