"""The simulated targets: IPU hardware constants (see shared/reference/ipu_model.md §2)."""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["Machine", "MK2", "IPU_MODEL", "machine_for"]


@dataclass(frozen=True)
class Machine:
    """Constants of one IPU target. Every number is an estimate, as the IPU Model's are."""

    name: str
    tiles_per_ipu: int = 1472
    bytes_per_tile: int = 638_976
    workers_per_tile: int = 6
    clock_hz: float = 1.327e9
    fp16_flops_per_cycle_per_tile: int = 128
    fp32_flops_per_cycle_per_tile: int = 32
    exchange_bytes_per_cycle_per_tile: int = 4
    sram_bytes_per_cycle_per_tile: int = 24
    sync_ns_per_hop: float = 15.0
    ipu_link_bytes_per_s: float = 16e9 * 0.85
    host_bytes_per_s: float = 5.5e9
    host_latency_s: float = 5e-6
    streaming_mem_bytes: float = 112e9
    streaming_bytes_per_s: float = 16e9
    compute_set_overhead_cycles: int = 200
    oom_is_error: bool = True

    @property
    def bytes_per_ipu(self) -> int:
        return self.tiles_per_ipu * self.bytes_per_tile


MK2 = Machine("ipu_hw")
# popxl's "ipu_model" device has 4 tiles and, like Poplar's IPU Model, never stops on OOM.
IPU_MODEL = replace(MK2, name="ipu_model", tiles_per_ipu=4, oom_is_error=False)
CPU = replace(MK2, name="cpu", oom_is_error=False)

_TARGETS = {"ipu_hw": MK2, "ipu_model": IPU_MODEL, "cpu": CPU}


def machine_for(device_desc: str) -> Machine:
    """The Machine for a Session device string ("ipu_hw", "ipu_model" or "cpu")."""
    try:
        return _TARGETS[device_desc]
    except (KeyError, TypeError):
        raise ValueError(
            f"Unknown device {device_desc!r}: use one of "
            f"{', '.join(repr(k) for k in _TARGETS)}. All run on the simulator."
        ) from None
