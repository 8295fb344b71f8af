"""The ways into popxl_fx: `training_model`, `compile` (and their `Options`)."""

from __future__ import annotations

from .compiled import compile
from .options import Options
from .trainer import Trainer, training_model

__all__ = ["Options", "Trainer", "compile", "training_model"]
