"""A trained model is freed with its trainer: nothing the capture leaves behind keeps it.

torch.overrides caches tables of torch's functions the first time they are asked for. Built
while the capture's recorders had replaced ``torch.rand`` and co, such a table kept the
recorder, its tracer and so the whole traced model alive for the rest of the process (a
1 B-parameter GPT's weights stayed after training). The tables are emptied first here, so
the capture is the first to fill them, as in a fresh process.
"""

from __future__ import annotations

import gc
import weakref

import torch

import popxl_fx
from examples.fx_phased import Decoder

_TABLES = (
    torch.overrides.get_ignored_functions,
    torch.overrides.get_testing_overrides,
    torch.overrides._get_tensor_methods,
)


def _train_once() -> weakref.ref:
    """One step of a small GPT (its capture fills the tables, as a plain MLP's does not)."""
    model = Decoder(32, 8, 32, 2, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    trainer = popxl_fx.training_model(model, opt)
    tokens = torch.randint(0, 32, (2, 8))
    trainer(tokens, tokens)
    return weakref.ref(model)


def test_the_model_is_freed_after_training():
    for table in _TABLES:
        table.cache_clear()
    model = _train_once()
    gc.collect()
    assert model() is None, [type(r).__name__ for r in gc.get_referrers(model())]


def _ours(table) -> list:
    entries = table()
    return [f for f in entries if str(getattr(f, "__module__", "")).startswith("popxl_fx")]


def test_torch_tables_hold_torch_functions_after_a_capture():
    for table in _TABLES:
        table.cache_clear()
    _train_once()
    assert [_ours(table) for table in _TABLES] == [[], [], []]
