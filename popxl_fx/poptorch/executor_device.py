"""The device side of `PoplarExecutor` (a mixin): attaching and detaching, ``destroy``, and
PopTorch's methods that need PopART or Poplar (tensor names, executables, cycle counts),
which raise PopTorch's errors or say why they cannot run here."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any, Callable

import torch

from . import wrapping
from .errors import Error, unsupported

if TYPE_CHECKING:  # pragma: no cover
    from .device_copy import DeviceCopy
    from .options import Options

__all__ = ["DeviceLink"]


class DeviceLink:
    """Mixin of `PoplarExecutor`: its device."""

    # PoplarExecutor's state these methods use (made in its __init__), for the type checker
    _attached: bool
    _device: DeviceCopy
    _training: bool
    _options: Options
    _impl: Any
    _user_model: torch.nn.Module
    _compilation_time: datetime.timedelta
    isCompiled: Callable[[], bool]  # PoplarExecutor's
    copyWeightsToHostIfNeeded: Callable[[], bool]  # WeightsLink's

    def isAttachedToDevice(self) -> bool:
        return self._attached

    def detachFromDevice(self) -> None:
        if not self.isCompiled():
            raise Error("Executable isn't compiled yet")
        if not self._attached:
            raise Error("Device is not attached")
        if self._training:
            self.copyWeightsToHostIfNeeded()
        self._attached = False

    def attachToDevice(self) -> None:
        if not self.isCompiled():
            raise Error("Executable isn't compiled yet")
        if self._attached:
            raise Error("Already attached to a device")
        self._device.write()  # PopTorch's attach writes the weights
        self._attached = True

    def destroy(self) -> None:
        """Drop the compiled programs (the model keeps its trained weights, and its class)."""
        if not self.isCompiled():
            return
        if self._training:
            self.copyWeightsToHostIfNeeded()
        self._impl = None
        self._attached = False
        self._device.clear()
        if self._training:
            wrapping.unwrap(self._user_model)

    def getTensorNames(self):
        raise unsupported("PoplarExecutor.getTensorNames", "there is no PopART IR to name")

    def getAnchoredTensor(self, short_name: str):
        raise unsupported("PoplarExecutor.getAnchoredTensor", "there is no PopART IR to name")

    def compileAndExport(self, filename: str, *args, **kwargs):
        raise unsupported("PoplarExecutor.compileAndExport", "there are no Poplar executables")

    def save(self, filename: str, *args, **kwargs):
        raise unsupported("PoplarExecutor.save", "there are no Poplar executables")

    def loadExecutable(self, filename: str):
        raise unsupported("PoplarExecutor.loadExecutable", "there are no Poplar executables")

    def cycleCount(self) -> int:
        """PopTorch's errors: counting is off, or (on) the model never ran, since a model
        counting cycles does not compile without hardware (`_build`)."""
        if not self._options._Popart.options["instrumentWithHardwareCycleCounter"]:
            raise Error(
                "Cycle count logging is disabled. Please set option logCycleCount to True to "
                "enable."
            )
        raise Error("Please run the model at least once before obtaining cycle count.")

    def compilationTime(self) -> datetime.timedelta:
        """How long the last build took (capture, lowering, planning and compiling)."""
        if not self.isCompiled():
            raise Error("Please compile the model before obtaining compilation time.")
        if not self._options._show_compilation_progress_bar:
            raise Error("Please set showCompilationProgressBar option to obtain compilation time.")
        return self._compilation_time
