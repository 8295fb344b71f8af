"""``memory="auto"`` and the OOM error on transformers written the usual ways (issue 34).

One GPT decoder (the blocks of examples/fx_phased.py, width 64, 3 blocks, AdamW; about 160 K
parameters) with its blocks held four ways: ``nn.ModuleList`` iterated in forward,
``nn.Sequential`` called whole, ``nn.ModuleDict`` iterated by ``.values()``, and plain
attributes ``block0`` .. ``block2``. On ``device="ipu_model"`` (2.44 MiB) it does not fit as
given (3.20 MiB, 131 %; 'blocks' and 'children' phases: 1.52 MiB). It had 6 blocks of width 48
(3.92 MiB; phases 1.91 MiB): the same candidates planned, the same choice, and half the ops to
trace and lower per candidate (test file 15.4 -> ~8 s of CPU); 3 blocks still repeat, so the
OOM table still has a group to show.

Before issue 34 the ModuleList and ModuleDict models failed under ``memory="auto"``:
the ``phased_execution="children"`` candidate raised ``PhaseError`` ('blocks' is never called
as a whole) and ended the search. Now every container trains 2 steps equal to the plain
program on ``device="cpu"`` bit for bit (losses and parameters), a candidate whose build
refuses the model is skipped and listed with its reason, the OOM table shows the repeated
blocks as one row first, and every ``Options(...)`` the OOM error offers trains as written.
"""

from __future__ import annotations

import dataclasses
import functools
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import popxl_fx
from examples.fx_phased import Block
from popxl_core.sim.machine import machine_for
from popxl_core.sim.plan import OutOfMemoryError, build_plan
from popxl_fx.auto import NoPlanFitsError
from popxl_fx.oom import ModuleRow, grouped, repeated_blocks
from popxl_fx.program import _model_oom_message

VOCAB, CONTEXT, WIDTH, LAYERS = 64, 16, 64, 3


class GPT(nn.Module):
    """The decoder with its blocks in ``container``; ``tuple_embed``: the embedding is a
    child returning a tuple (as HF embeddings may), so phases of the top-level children
    cannot split there."""

    def __init__(
        self,
        container: str,
        tuple_embed: bool = False,
        width: int = WIDTH,
        layers: int = LAYERS,
        vocab: int = VOCAB,
    ) -> None:
        super().__init__()
        self.container, self.layers = container, layers
        self.embed = Embed(tuple_embed, vocab, width)
        blocks = [Block(width, max(4, width // 64)) for _ in range(layers)]
        if container == "list":
            self.blocks = nn.ModuleList(blocks)
        elif container == "sequential":
            self.blocks = nn.Sequential(*blocks)
        elif container == "dict":
            self.blocks = nn.ModuleDict({f"b{i}": b for i, b in enumerate(blocks)})
        else:
            for i, b in enumerate(blocks):
                setattr(self, f"block{i}", b)
        self.ln_f, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)

    def _blocks(self) -> list[nn.Module]:
        if self.container == "list":
            return list(self.blocks)
        if self.container == "dict":
            return list(self.blocks.values())
        return [getattr(self, f"block{i}") for i in range(self.layers)]

    def forward(self, idx, targets):
        x = self.embed(idx)
        if self.embed.tuple_out:
            x = x[0] + x[1]
        if self.container == "sequential":
            x = self.blocks(x)
        else:
            for block in self._blocks():
                x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class Embed(nn.Module):
    def __init__(self, tuple_out: bool, vocab: int = VOCAB, width: int = WIDTH) -> None:
        super().__init__()
        self.tuple_out = tuple_out
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(CONTEXT, width)

    def forward(self, idx):
        parts = self.tok(idx), self.pos(torch.arange(idx.shape[1]))
        return parts if self.tuple_out else parts[0] + parts[1]


def _model(container: str, **kwargs) -> GPT:
    torch.manual_seed(0)
    return GPT(container, **kwargs)


def _batches(steps: int = 2) -> list:
    g = torch.Generator().manual_seed(1)
    make = lambda: torch.randint(0, VOCAB, (2, CONTEXT), generator=g)
    return [(make(), make()) for _ in range(steps)]


def _train(model: nn.Module, options: popxl_fx.Options):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    trainer = popxl_fx.training_model(model, opt, options=options)
    losses = torch.stack([trainer(x, y) for x, y in _batches()])
    return trainer, losses


@functools.lru_cache(maxsize=None)
def _plain(container: str, tuple_embed: bool = False) -> tuple:
    """(model, trainer, losses) of the plain program on "cpu", built once per module: the
    reference of every test on this container and the program the OOM tests plan."""
    model = _model(container, tuple_embed=tuple_embed)
    trainer, losses = _train(model, popxl_fx.Options(device="cpu"))
    return model, trainer, losses


def _assert_same_as_cpu(model: nn.Module, trainer, losses) -> None:
    twin, _, expected = _plain(model.container, model.embed.tuple_out)
    assert torch.equal(losses, expected), (losses, expected)
    for key, value in twin.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key


@pytest.mark.parametrize("container", ["list", "sequential", "dict", "attributes"])
def test_auto_trains_every_block_container_like_the_plain_program(container):
    model = _model(container)
    trainer, losses = _train(model, popxl_fx.Options(device="ipu_model", memory="auto"))
    assert trainer.options.phased_execution in ("blocks", "children"), trainer.memory_plan
    assert "skipped" not in trainer.memory_plan, trainer.memory_plan
    plan = trainer.session.plan
    assert not plan.out_of_memory and plan.memory[0].total <= plan.memory[0].capacity
    _assert_same_as_cpu(model, trainer, losses)


def test_children_phases_run_a_module_lists_items():
    model = _model("list")
    trainer, losses = _train(model, popxl_fx.Options(device="cpu", phased_execution="children"))
    labels = [row.label for row in trainer.report().rows if row.phase]
    assert labels == ["embed", *[f"blocks.{i}" for i in range(LAYERS)], "ln_f", "head"]
    _assert_same_as_cpu(model, trainer, losses)


def test_a_candidate_that_does_not_apply_is_skipped_and_explained():
    model = _model("list", tuple_embed=True)  # 'children' would pass a tuple between phases
    trainer, losses = _train(model, popxl_fx.Options(device="ipu_model", memory="auto"))
    assert trainer.options.phased_execution == "blocks", trainer.memory_plan
    skipped = re.findall(
        r"Options\((.*)\): skipped, it does not apply \(PhaseError: .*crosses", trainer.memory_plan
    )
    assert "phased_execution='children'" in skipped, trainer.memory_plan
    assert "skipped, it does not apply" in str(popxl_fx.explain(trainer))
    _assert_same_as_cpu(model, trainer, losses)


def _oom_text(container: str) -> str:
    """The OOM error's text for the model planned on an "ipu_hw" of 4 tiles: the capacity of
    "ipu_model" (2.44 MiB), where a Session only warns; the options it offers are then tried
    on "ipu_model"."""
    model, trainer, _ = _plain(container)
    with pytest.raises(OutOfMemoryError) as info:
        build_plan(trainer.ir, dataclasses.replace(machine_for("ipu_hw"), tiles_per_ipu=4))
    return _model_oom_message(info.value, popxl_fx.Options(device="ipu_model"), "", model)


@pytest.mark.parametrize(
    "container, row",
    [
        ("list", "blocks.0-2 (3 x Block)"),
        ("dict", "blocks.b0-2 (3 x Block)"),
        ("attributes", "block0-2 (3 x Block)"),
    ],
)
def test_oom_table_groups_the_repeated_blocks_first(container, row):
    lines = _oom_text(container).splitlines()
    head = next(i for i, line in enumerate(lines) if re.match(r"\s+module\s+weights", line))
    assert lines[head + 1].split("  ")[2:3] == [row] or lines[head + 1].strip().startswith(row)
    assert not any(re.match(r"\s+blocks?\.?b?\d+\.", line) for line in lines[head + 1 :])


def test_every_option_the_oom_error_offers_trains_as_written():
    text = _oom_text("list")
    offered = re.findall(r"^    (Options\(.*?\))[: ]", text.split("Options to try")[1], re.M)
    assert "Options(phased_execution='blocks')" in offered and "Options(memory='auto')" in offered
    for option in offered:
        changes = eval(option, {"Options": dict})  # (the message's own text)
        model = _model("list")
        options = popxl_fx.Options(device="ipu_model", **changes)
        trainer, losses = _train(model, options)
        assert not trainer.session.plan.out_of_memory, option
        assert torch.isfinite(losses).all(), option


class TwoMLPBlock(nn.Module):
    """A block with two identical inner MLPs: the inner ones repeat more often than it."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = (nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(2))

    def forward(self, x):
        return self.b(self.a(x))


def test_repeated_blocks_are_the_outermost_ones():
    model = nn.Sequential(nn.Linear(8, 8), *[TwoMLPBlock() for _ in range(3)])
    (found,) = repeated_blocks(model)  # the 6 inner MLPs are counted in their blocks' rows
    assert found.label == "1-3 (3 x TwoMLPBlock)"
    assert found.holds("2.a.0") and not found.holds("0")
    rows = [ModuleRow("2.a.0", weights=288), ModuleRow("0", weights=100), ModuleRow("1.b.0", 8)]
    assert [(r.module, r.total) for r in grouped(rows, [found])] == [
        ("1-3 (3 x TwoMLPBlock)", 296),
        ("0", 100),
    ]


def test_no_plan_fits_lists_the_candidates_the_optimizer_refuses():
    """Adam(fused=True) cannot update phase by phase: the phased candidates are skipped (the
    search goes on, it used to stop at the first with UnsupportedOptimizerError) and the
    error names them with the optimizer's reason."""
    from tests.test_fx_memory_auto import _data
    from tests.test_fx_memory_auto import _model as mlp

    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    options = popxl_fx.Options(device="ipu_model", memory="auto")
    trainer = popxl_fx.training_model(model, opt, F.cross_entropy, options)
    with pytest.raises(NoPlanFitsError) as info:
        trainer(*_data()[0])
    text = str(info.value)
    assert "Options(outline='auto', recompute=True): peak" in text  # planned after the skips
    skipped = re.findall(r"  (Options\(.*?\)): skipped, it does not apply \((\w+)", text)
    assert ("Options(phased_execution='blocks')", "UnsupportedOptimizerError") in skipped
    assert len(skipped) == 6, text  # blocks, children, each alone and with accumulation 2, 4
