"""PopTorch's device copy of a model's parameters and buffers: the IPU's own memory.

In PopTorch the IPU holds its own copy of the weights and buffers. It is written from the
model when the executor attaches (its first call or compile) and by ``copyWeightsToDevice``;
the model is written from it by ``copyWeightsToHost``. Between the two, the host model and
the device may differ: a host-trained model is not seen by an inference executor compiled
before, and a device-trained one is not seen by the host until it is copied back.

popxl_fx shares its variables' storage with the torch tensors it is given. `DeviceCopy`
keeps a second storage for each of the model's tensors and, while an executor builds or runs
(`DeviceCopy.swapped_in`), points each parameter and buffer object at it (``t.data``): the
program shares the device copy, and the host's values come back after the call. The tensor
objects stay the same, so the optimizer's param groups and state keep their keys.

After a training call the device's tensors stay in the model (`DeviceCopy.park`), in their
hooked classes: the host is stale after such a call until it is read (PopTorch's implicit
``copyWeightsToHost``), and every read goes through a hook (`state_hooks`) that first puts
the host's data back (`DeviceCopy.settle`) and then copies the device's values into it. So
a loop of training calls that does not read the model swaps nothing per call (a read,
``p.data = x`` included, puts the host's data back first; data replaced where no hook saw
it is the host's, and the device keeps its own, as in PopTorch).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
from torch import nn

__all__ = ["DeviceCopy", "Swap", "plain_type"]

# the per-executor classes that hook a training model's tensors (`state_hooks`) -> the class
# each one hooks; a tensor runs in the program as its plain class
HOOKED_TYPES: dict[type, type] = {}


def plain_type(cls: type) -> type:
    return HOOKED_TYPES.get(cls, cls)


# How many parameters, buffers and submodules have been registered on any module, as torch's
# global registration hooks count them (attribute assignment and ``register_*`` both call
# them): a model's tensors by name stay what they were while the count does not move.
_REGISTRATIONS = [0]


def _registered(*_: object) -> None:
    _REGISTRATIONS[0] += 1  # returns None: the registered object is kept as it is


for _hook in (
    torch.nn.modules.module.register_module_parameter_registration_hook,
    torch.nn.modules.module.register_module_buffer_registration_hook,
    torch.nn.modules.module.register_module_module_registration_hook,
):
    _hook(_registered)


def model_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's parameters and buffers by name (each tensor once, as PopTorch names them)."""
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


class DeviceCopy:
    """The device's values of ``model``'s parameters and buffers, by name."""

    def __init__(self, model: nn.Module) -> None:
        self._model = model
        self._device: dict[str, torch.Tensor] = {}
        self._tensors: tuple[int, dict[str, torch.Tensor]] | None = None
        # the device tensors in the order of `_model_tensors`, for the dict they came from
        self._listed: tuple[dict, dict, list[torch.Tensor]] | None = None
        self._parked: Swap | None = None  # the device's tensors left in the model (`park`)

    def _model_tensors(self) -> dict[str, torch.Tensor]:
        """`model_tensors` of the model, walked again only after a registration (each call
        swaps them in and out: the walk was a third of that)."""
        seen = self._tensors
        if seen is None or seen[0] != _REGISTRATIONS[0]:
            seen = self._tensors = (_REGISTRATIONS[0], model_tensors(self._model))
        return seen[1]

    def __bool__(self) -> bool:
        return bool(self._device)

    def clear(self) -> None:
        self.settle()
        self._device = {}

    def write(self, names: Iterable[str] | None = None) -> None:
        """Host to device: the model's values (of ``names``, or all) become the device's.
        Written through the tensors themselves, so the program sees a write (``_version``)."""
        with self.swapped_in() as hosts, torch.no_grad():
            for name in hosts if names is None else names:
                tensor, host = hosts[name]
                tensor.copy_(host)

    def read(self) -> None:
        """Device to host: the device's values become the model's."""
        self.settle()
        with torch.no_grad():
            for name, tensor in self._model_tensors().items():
                device = self._device.get(name)
                if device is not None and _fits(device, tensor):
                    tensor.copy_(device)

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[dict[str, tuple[torch.Tensor, torch.Tensor]]]:
        """While open, each parameter and buffer holds the device's values (in its plain
        class: no hook copies while the program runs). Yields name -> (tensor, host data)."""
        swap = self.swap_in()
        try:
            yield dict(zip(self._model_tensors(), zip(swap.tensors, swap.hosts)))
        finally:
            swap.out()

    def swap_in(self) -> Swap:
        """`swapped_in` without a context manager (a training call's per-step path): the
        device's tensors in the model until ``.out()`` on what it returns."""
        tensors = self._model_tensors()
        parked, self._parked = self._parked, None
        if parked is not None:
            if parked.resumes(tensors):
                return parked
            parked.settle()
        listed = tuple(tensors.values())
        classes = list(map(type, listed))
        for t, cls in zip(listed, classes):
            t.__class__ = HOOKED_TYPES.get(cls, cls)
        swap = Swap(tensors, classes, [t.data for t in listed])
        try:
            devices = self._device_tensors(tensors, swap.hosts)
            for t, device in zip(listed, devices):
                t.data = device
        except BaseException:
            swap.out()
            raise
        swap.pointers = [d.data_ptr() for d in devices]
        return swap

    def park(self, swap: Swap) -> None:
        """End a training call leaving the device's tensors in the model, in their own
        (hooked) classes, until `settle` or the next `swap_in`."""
        swap.restore_classes()
        self._parked = swap

    def settle(self) -> None:
        """The host's data back in the model's tensors (a parked call's)."""
        parked, self._parked = self._parked, None
        if parked is not None:
            parked.settle()

    def _device_tensors(self, tensors: dict, hosts: list) -> list[torch.Tensor]:
        """The device's tensor of each of ``tensors`` (their ``hosts`` data), as listed for
        the last call while the walk and the device's dict are the same objects and each
        host still fits its device tensor (a cheap check: shape and dtype)."""
        listed = self._listed
        if listed is not None and listed[0] is tensors and listed[1] is self._device:
            devices = listed[2]
            if all(map(_fits, devices, hosts)):
                return devices
        devices = [self._device_tensor(n, h) for n, h in zip(tensors, hosts)]
        self._listed = (tensors, self._device, devices)
        return devices

    def _device_tensor(self, name: str, host: torch.Tensor) -> torch.Tensor:
        """The device's tensor of ``name``: a copy of the host's value when it has none yet
        (a tensor the model gained, or one whose shape or dtype the host changed)."""
        device = self._device.get(name)
        if device is None or not _fits(device, host):
            device = self._device[name] = host.detach().clone()
        return device


class Swap:
    """The model's tensors while the device's are in them: their classes and host data."""

    __slots__ = ("classes", "hosts", "pointers", "tensors", "walk")

    def __init__(self, walk: dict, classes: list, hosts: list) -> None:
        self.walk, self.tensors = walk, tuple(walk.values())
        self.classes, self.hosts = classes, hosts
        self.pointers: list[int] = []  # each device tensor's data, as swapped in

    def out(self) -> None:
        """The host's data and the tensors' own classes back."""
        for t, host in zip(self.tensors, self.hosts):
            t.data = host
        self.restore_classes()

    def restore_classes(self) -> None:
        for t, cls in zip(self.tensors, self.classes):
            t.__class__ = cls

    def resumes(self, walk: dict) -> bool:
        """A parked swap serves the next call: the walk is the same and each tensor still
        holds its device data; their classes are plain again, as `swap_in` makes them
        (before reading the pointers: a hooked class would call its hooks)."""
        if walk is not self.walk:
            return False
        self.classes = list(map(type, self.tensors))
        for t, cls in zip(self.tensors, self.classes):
            t.__class__ = HOOKED_TYPES.get(cls, cls)
        if list(map(_DATA_PTR, self.tensors)) != self.pointers:
            self.restore_classes()
            return False
        return True

    def settle(self) -> None:
        """Each tensor's host data back, but where the user assigned other data meanwhile
        (``p.data = x``): that is the host's now."""
        for t, host, pointer in zip(self.tensors, self.hosts, self.pointers):
            cls = type(t)
            t.__class__ = HOOKED_TYPES.get(cls, cls)  # no hook while it is read
            if t.data_ptr() == pointer:
                t.data = host
            t.__class__ = cls


_DATA_PTR = torch.Tensor.data_ptr


def _fits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype
