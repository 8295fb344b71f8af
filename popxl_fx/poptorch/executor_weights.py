"""The weights side of `PoplarExecutor` (a mixin): PopTorch's device copy of the model's
parameters and buffers, and the copies between it and the host model.

What PopTorch does (``_poplar_executor.py``, the user guide's "Weight sharing"):

- Attaching (the first call or ``compile``, ``attachToDevice``) writes the model's weights to
  the device: an inference executor then keeps them, whatever the host does later, until
  ``copyWeightsToDevice``.
- A training call leaves the host stale; reading the model (`state_hooks`) or
  ``copyWeightsToHost`` copies the device's values back, once per call.
- An inference executor of a model that a training executor holds first asks it to copy
  (implicitly), and writes the model's weights to its own device copy when they changed.
- ``copyNamedBuffersToDevice`` writes only ``Options.updatableNamedBuffers``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from torch import nn

from . import _logging
from .errors import Error

if TYPE_CHECKING:  # pragma: no cover
    from .device_copy import DeviceCopy, Swap
    from .options import Options

__all__ = ["NO_EXECUTABLE", "WeightsLink"]

NO_EXECUTABLE = "Model has not been compiled or has been destroyed."


class WeightsLink:
    """Mixin of `PoplarExecutor`: ``self._device`` (a `DeviceCopy` of ``self._user_model``)."""

    _dirty_host_weights = False  # a training call ran since the last copy to the host
    _host_weights_version = 0  # copies to the host so far (inference executors compare it)
    _busy = 0  # building or running: reads of the model are the program's, not the user's
    _seen_host_version = 0  # the trainer's ``_host_weights_version`` this device last took
    # what it reads of `PoplarExecutor`
    _attached: bool
    _device: DeviceCopy
    _training: bool
    _user_model: nn.Module
    _options: Options

    def isCompiled(self) -> bool:  # `PoplarExecutor`'s
        raise NotImplementedError

    @contextlib.contextmanager
    def _on_device(self) -> Iterator[None]:
        """Build or run with the device's copy in the model's tensors (`DeviceCopy`)."""
        swap = self._to_device()
        try:
            yield
        finally:
            self._off_device(swap)

    def _to_device(self) -> Swap:
        """`_on_device`'s entry (each call runs between it and `_off_device`, without a
        context manager's generator: a small model's step is a fraction of a millisecond)."""
        if not self._training:
            self._sync_from_trainer()
        self._busy += 1
        try:
            if not self._attached:  # PopTorch's attach writes the weights
                self._device.write()
            return self._device.swap_in()
        except BaseException:
            self._busy -= 1
            raise

    def _off_device(self, swap: Swap, park: bool = False) -> None:
        """`_to_device`'s exit; ``park``: after a training call, leave the device's tensors
        in the model until it is read (`DeviceCopy.park`)."""
        try:
            if park:
                self._device.park(swap)
            else:
                swap.out()
        finally:
            self._busy -= 1

    def _sync_from_trainer(self) -> None:
        """An inference executor of a model that a training executor holds: PopTorch's
        implicit copies (the trainer's to the host, then the host's to this device)."""
        if self._training:
            return
        copy_if_needed = getattr(self._user_model, "copyWeightsToHostIfNeeded", None)
        if not callable(copy_if_needed):
            return
        copy_if_needed()
        version = self._user_model._host_weights_version
        if self._attached and version != self._seen_host_version:
            _logging.console().debug("Implicit copyWeightsToDevice()")
            self.copyWeightsToDevice()
        self._seen_host_version = version

    def copyWeightsToHostIfNeeded(self) -> bool:
        """Copy the weights to the host if a training call ran since the last copy."""
        if not self._dirty_host_weights or self._busy:
            return False
        _logging.console().debug("Implicit copyWeightsToHost()")
        self.copyWeightsToHost()
        return True

    def copyWeightsToHost(self) -> None:
        """Write the device's weights and buffers into the model's tensors."""
        self._require_compiled()
        self._dirty_host_weights = False  # the copy reads the model: no second copy
        self._busy += 1
        try:
            self._device.read()
        finally:
            self._busy -= 1
        self._host_weights_version += 1

    def copyWeightsToDevice(self) -> None:
        """Write the model's weights and buffers to the device (done on the first call)."""
        self._require_compiled()
        self._dirty_host_weights = False  # the host's values are now the device's
        self._device.write()

    def copyNamedBuffersToDevice(self) -> None:
        """Write the buffers named by ``Options.updatableNamedBuffers`` to the device."""
        self._require_compiled()
        names = self._options._Popart.options.get("updatableNamedBuffers")
        if not names:
            raise Error("No named buffers marked as updatable via updatableNamedBuffers option")
        self._dirty_host_weights = False
        self._device.write(names)

    def __del__(self) -> None:
        # an executor dropped after training: its device's weights go back to the model, which
        # would otherwise be left with the values of its last copy
        device = self.__dict__.get("_device")
        if self._dirty_host_weights and device:
            device.read()
        elif device is not None:
            device.settle()

    def _require_compiled(self) -> None:
        if not self.isCompiled():
            raise Error(NO_EXECUTABLE)
