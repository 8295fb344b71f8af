"""Devices as PopART's ``DeviceManager`` hands them out, for the simulator's targets.

A `DeviceInfo` names the kind of device a Session runs on (``"cpu"``, ``"ipu_model"``; there
is no IPU hardware here) and how many IPUs it has. PopXL's ``Session._set_device`` gives a
Session such a device; attaching checks that it is the kind the Session was built for and
has the IPUs the program needs, as Poplar refuses an executable on another target.

>>> DeviceManager().createIpuModelDevice({"numIPUs": 2}).numIpus
2
"""

from __future__ import annotations

from typing import List, Optional

__all__ = ["DeviceInfo", "DeviceManager", "to_device_info"]

# PopART's DeviceType names for the Session device strings
_TYPES = {"cpu": "Cpu", "ipu_model": "IpuModel", "ipu_hw": "Ipu"}


class DeviceInfo:
    """A device of kind ``device_desc`` with ``num_ipus`` IPUs (PopART's DeviceInfo: the
    attributes and attach calls scripts use)."""

    def __init__(self, device_desc: str, num_ipus: int = 1, tiles_per_ipu: Optional[int] = None):
        if device_desc not in _TYPES:
            raise ValueError(f"unknown device kind {device_desc!r}; one of {sorted(_TYPES)}")
        self.device_desc, self.numIpus = device_desc, int(num_ipus)
        self.tilesPerIPU = tiles_per_ipu
        self.isAttached = False

    @property
    def type(self) -> str:
        """PopART's DeviceType name: Cpu, IpuModel or Ipu."""
        return _TYPES[self.device_desc]

    def attach(self) -> bool:
        self.isAttached = True
        return True

    def tryAttachUntilTimeout(self) -> bool:
        return self.attach()

    def detach(self) -> None:
        self.isAttached = False

    def __enter__(self) -> "DeviceInfo":
        self.attach()
        return self

    def __exit__(self, *exc) -> None:
        self.detach()

    def __repr__(self) -> str:
        return f"DeviceInfo(type={self.type}, numIpus={self.numIpus})"


class DeviceManager:
    """PopART's DeviceManager over the simulator: CPU and IPU Model devices; no IPU hardware
    is attached to this machine, so none is enumerated or acquired."""

    def createCpuDevice(self) -> DeviceInfo:
        return DeviceInfo("cpu")

    def createIpuModelDevice(self, opts: Optional[dict] = None) -> DeviceInfo:
        opts = opts or {}
        return DeviceInfo("ipu_model", opts.get("numIPUs", 1), opts.get("tilesPerIPU"))

    def enumerateDevices(self, *args, **kwargs) -> List[DeviceInfo]:
        return []

    def acquireAvailableDevice(self, *args, **kwargs) -> None:
        return None

    def setOnDemandAttachTimeout(self, seconds: int) -> None:
        """Accepted and unused: there is no hardware to wait for."""


def to_device_info(device_type: str, num_ipus: int = 1) -> DeviceInfo:
    """PopXL's ``popxl.utils._to_device_info``: a device of the Session kind ``device_type``."""
    if device_type == "ipu_hw":
        raise RuntimeError(
            "_to_device_info('ipu_hw'): no IPU hardware is attached to this machine; the "
            "simulator runs 'ipu_hw' Sessions without a device object."
        )
    if device_type == "cpu":
        return DeviceManager().createCpuDevice()
    return DeviceManager().createIpuModelDevice({"numIPUs": num_ipus})
