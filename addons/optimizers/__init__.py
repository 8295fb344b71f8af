"""addons.optimizers: optimiser steps as Modules (`adam.AdamOptimizerStep`)."""

from .adam import AdamOptimizerStep

__all__ = ["AdamOptimizerStep"]
