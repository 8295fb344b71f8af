"""The optimizer side of `PoplarExecutor` (a mixin): PopTorch's checks of a new optimizer,
``setOptimizer``, and the optimizer state a PopTorch optimizer reads from and loads into the
built program (`optim_state`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from . import optim, optim_attrs, optim_map, optim_state
from .enums import ConnectionType
from .errors import Error

if TYPE_CHECKING:  # pragma: no cover
    from .options import Options

__all__ = ["OptimizerLink"]


class OptimizerLink:
    """Mixin of `PoplarExecutor`: its optimizer."""

    # PoplarExecutor's state these methods use (made in its __init__), for the type checker
    _training: bool
    _options: Options
    _attrs: optim_attrs.AttributeTracker
    _user_model: torch.nn.Module
    _optimizer: Any  # a torch or PopTorch optimizer; None for inference
    _impl: Any  # the popxl_fx trainer or inference model, made on compile (None before)

    def setOptimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Train with ``optimizer`` from the next call (its state and hyper-parameters)."""
        if not self._training:
            raise Error("setOptimizer is only for a trainingModel.")
        compiled = self._impl is not None and self._impl._active is not None
        self._take_optimizer(optimizer, compiled)
        self._optimizer = optimizer
        # popxl_fx's trainer reads its optimizer's groups and state: a new trainer reads the
        # new optimizer's (the weights are the model's, so nothing else is lost)
        self._impl = None

    def _take_optimizer(self, optimizer: torch.optim.Optimizer, compiled: bool) -> None:
        """PopTorch's checks of an optimizer (`optim_attrs`), then popxl_fx's refusals."""
        optim_attrs.warn_if_subclassed(optimizer)
        optim_attrs.check_accum_strategy(optimizer, self._options, compiled)
        self._attrs.check(optimizer)
        optim_map.torch_view(optimizer)  # refused now, not at the next call

    def _share_optimizer_state(self, impl) -> None:
        """A PopTorch optimizer's ``state_dict`` reads the built program's state from now
        on (not offline: PopTorch has no device to read it from)."""
        opt = self._optimizer
        if not self._training or not isinstance(opt, optim.Optimizer):
            return
        if self._options.connection_type == ConnectionType.Never:
            return
        names = {id(p): n for n, p in self._user_model.named_parameters()}
        opt._ipu_reader = lambda: optim_state.read(impl._active, names)

    def _take_loaded_state(self, impl) -> None:
        opt = self._optimizer
        if self._training and getattr(opt, "_ipu_loaded", None) is not None:
            names = {id(p): n for n, p in self._user_model.named_parameters()}
            loaded, opt._ipu_loaded = opt._ipu_loaded, None
            optim_state.apply_loaded(loaded, impl._active, names)
