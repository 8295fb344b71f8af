"""Phased execution of a PyTorch transformer with popxl_fx, against the same model unphased.

A GPT-style decoder written in plain PyTorch (token and position embeddings, ``--layers``
pre-norm blocks of causal self-attention and an MLP, a tied-free head, cross-entropy loss
returned by ``forward``) is trained twice from the same initial weights on the same random
token batches with AdamW:

- unphased: ``popxl_fx.training_model(model, opt)``: every weight and all AdamW state on chip;
- phased: ``Options(phased_execution="blocks")``: the repeated blocks (and the code around
  them) run as phases; each phase's weights and AdamW state live in Streaming Memory and are
  loaded for its forward, loaded again for its backward and its optimizer update, and stored.

The losses are equal (bit for bit: the same kernels on the same values). The script then
prints ``phased.report()`` (a `popxl_fx.phase_report.PhasedReport`: per phase its peak, its
weights and state loaded on chip, its Streaming Memory traffic and cycles, then the step's
traffic and the transfers' share of the estimated step time) and
``unphased.report().diff(phased.report())``: ``variable_bytes`` (weights and state on
chip) drops to zero, the on-chip peak drops to the largest phase's working set plus the
activations, and the step pays for it in Streaming Memory traffic (``remote_*_bytes``) and
estimated cycles. ``--memory-auto`` instead lets ``Options(memory="auto")`` decide (on
``--device ipu_model``, a 4-tile IPU of 2.4 MiB, the model does not fit and it phases).

    python examples/fx_phased.py --steps 3 --layers 6 --width 128
"""

from __future__ import annotations

import argparse
import copy

import torch
import torch.nn.functional as F
from torch import nn

import popxl_fx


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Decoder(nn.Module):
    def __init__(self, vocab: int, context: int, d: int, heads: int, layers: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets):
        positions = torch.arange(idx.shape[1])
        x = self.blocks(self.tok(idx) + self.pos(positions))
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def train(model: nn.Module, options: popxl_fx.Options, batches) -> tuple:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, eps=1e-6)
    trainer = popxl_fx.training_model(model, opt, options=options)
    losses = [float(trainer(x, y)) for x, y in batches]
    return trainer, losses


def main(argv: list[str] | None = None) -> float:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--context", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--device", default="ipu_hw", choices=popxl_fx.options.DEVICES)
    ap.add_argument("--memory-auto", action="store_true", help="Options(memory='auto')")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    model = Decoder(args.vocab, args.context, args.width, args.heads, args.layers)
    twin = copy.deepcopy(model)  # the same initial weights for the unphased run
    g = torch.Generator().manual_seed(1)
    shape = (args.batch, args.context)
    tokens = lambda: torch.randint(0, args.vocab, shape, generator=g)
    batches = [(tokens(), tokens()) for _ in range(args.steps)]
    chosen = dict(memory="auto") if args.memory_auto else dict(phased_execution="blocks")
    phased, p_losses = train(model, popxl_fx.Options(device=args.device, **chosen), batches)
    plain, u_losses = train(twin, popxl_fx.Options(device="cpu"), batches)
    for step, (lp, lu) in enumerate(zip(p_losses, u_losses)):
        print(f"step {step}: loss phased {lp:.6f}  unphased {lu:.6f}")
    worst = max(abs(a - b) for a, b in zip(p_losses, u_losses))
    print(f"worst loss difference: {worst:.3g}")
    if args.memory_auto:
        print(phased.memory_plan)
    print(phased.report().summary())
    print(plain.report().diff(phased.report(), ("unphased", "phased")))
    return worst


if __name__ == "__main__":
    main()
