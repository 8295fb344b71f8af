"""The simulated targets: one table of IPU constants, each with its source.

Sources are the numbered entries of shared/reference/ipu_model.md (§1 table, §2 defaults, §8
list); [D] marks a figure derived there by arithmetic, "fitted" a fixed cost calibrated on
published wall times (`calibration.py`), "assumed" a value chosen here for want of a source.
Every number is an estimate, the same status the IPU Model's own cycle figures have.

Example:
    >>> target("ipu_hw:bow").clock_hz
    1850000000.0
    >>> target("ipu_model", tiles_per_ipu=16).bytes_per_ipu
    10223616
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = [
    "CPU",
    "IPU_MODEL",
    "MK2",
    "BOW",
    "SOURCES",
    "TARGETS",
    "Machine",
    "machine_for",
    "target",
]


@dataclass(frozen=True)
class Machine:
    """Constants of one IPU target (see `SOURCES` for where each comes from)."""

    name: str
    tiles_per_ipu: int = 1472
    bytes_per_tile: int = 638_976
    num_ipus: int | None = None  # IPUs per replica; None: as many as the program uses
    workers_per_tile: int = 6
    clock_hz: float = 1.327e9
    fp16_flops_per_cycle_per_tile: int = 128
    fp32_flops_per_cycle_per_tile: int = 32
    exchange_bytes_per_cycle_per_tile: int = 4
    sram_bytes_per_cycle_per_tile: int = 24
    sync_ns_per_hop: float = 15.0
    ipu_link_bytes_per_s: float = 16e9 * 0.85
    host_bytes_per_s: float = 5.5e9
    host_latency_s: float = 0.183e-3
    run_overhead_s: float = 0.382e-3
    streaming_mem_bytes: float = 112e9
    streaming_bytes_per_s: float = 16e9
    compute_set_overhead_cycles: int = 200
    oom_is_error: bool = True
    oom_warns: bool = False

    @property
    def bytes_per_ipu(self) -> int:
        return self.tiles_per_ipu * self.bytes_per_tile

    @property
    def run_overhead_cycles(self) -> int:
        return round(self.run_overhead_s * self.clock_hz)


SOURCES: dict[str, str] = {
    "tiles_per_ipu": "1472 on Mk2 GC200 and Bow [S2, S3, S6]; 4 for popxl 'ipu_model' "
    "(createIpuModelDevice's defaultFewTiles) [S12]",
    "bytes_per_tile": "624 KiB = 638,976 B per tile [S1]; Bow the same [S6]",
    "num_ipus": "IPUs per replica; popxl asks for as many as the program uses [S12]",
    "workers_per_tile": "6 hardware threads per tile [S3, S5]",
    "clock_hz": "Mk2 1.327 GHz [D: 250e12 / (1472 x 128)]; Bow 1.85 GHz [S6]",
    "fp16_flops_per_cycle_per_tile": "128 = 64 FP16 MACs [D from 250 TFLOPS]",
    "fp32_flops_per_cycle_per_tile": "32 = 16 FP32 MACs [D from 62.5 TFLOPS]",
    "exchange_bytes_per_cycle_per_tile": "4 [D: 8 TB/s / 1472 / 1.327 GHz] [S2]",
    "sram_bytes_per_cycle_per_tile": "24 [D: 47.5 TB/s / 1472 / 1.327 GHz] [S2]",
    "sync_ns_per_hop": "15 ns per hop, hops = 1 + IPUs/4 (poplibs IPUModel config) [S8]",
    "ipu_link_bytes_per_s": "16 GB/s per link and direction at 85 % efficiency [S8, S15]",
    "host_bytes_per_s": "5.5 GB/s measured back to the host via the gateway [S16]",
    "host_latency_s": "fitted: fixed cost of one host stream transfer, with run_overhead_s, to "
    "the remote-variables/RTS tutorial's 3.37 ms per training step and 0.80 ms per inference "
    "step [S14] (calibration.py)",
    "run_overhead_s": "fitted: fixed cost of one Session.run (host round trip, program "
    "launch), with host_latency_s, to the same two figures [S14] (calibration.py)",
    "streaming_mem_bytes": "M2000: 448 GB per 4 IPUs [S3, S4]; Bow-2000 256 GB per 4 [S6]",
    "streaming_bytes_per_s": "16 GB/s per direction, PCIe Gen4 x8 to the gateway (low "
    "confidence) [S15]",
    "compute_set_overhead_cycles": "assumed: 10^2-10^3 cycles per compute set (ipu_model.md §2)",
    "oom_is_error": "ipu_hw stops on OOM; the IPU Model never does [S9, S10]",
    "oom_warns": "our choice: 'ipu_model' warns where 'ipu_hw' would fail",
}

MK2 = Machine("ipu_hw")
BOW = replace(MK2, name="ipu_hw:bow", clock_hz=1.85e9, streaming_mem_bytes=64e9)
# popxl's "ipu_model" device has 4 tiles and, like Poplar's IPU Model, never stops on OOM.
IPU_MODEL = replace(MK2, name="ipu_model", tiles_per_ipu=4, oom_is_error=False, oom_warns=True)
# "cpu" plans like Mk2 but has no memory limit worth reporting (PopXL's cpu device neither).
CPU = replace(MK2, name="cpu", oom_is_error=False)

TARGETS: dict[str, Machine] = {m.name: m for m in (MK2, BOW, IPU_MODEL, CPU)}
_OVERRIDABLE = frozenset({"tiles_per_ipu", "num_ipus", "bytes_per_tile", "clock_hz"})


def target(name: str = "ipu_hw", **overrides) -> Machine:
    """A target from `TARGETS` with overrides of tiles_per_ipu, num_ipus, bytes_per_tile or
    clock_hz; pass the result to ``Session(ir, machine)``."""
    base = machine_for(name)
    bad = sorted(set(overrides) - _OVERRIDABLE)
    if bad:
        raise ValueError(
            f"target({name!r}): cannot override {', '.join(bad)}; overridable: "
            f"{', '.join(sorted(_OVERRIDABLE))}."
        )
    for key, value in overrides.items():
        if value is not None and not value > 0:
            raise ValueError(f"target({name!r}): {key} must be positive, got {value!r}.")
    return replace(base, **overrides)


def machine_for(device_desc: str | Machine) -> Machine:
    """The Machine for a Session device string ("ipu_hw", "ipu_hw:bow", "ipu_model", "cpu");
    a Machine (e.g. from `target`) is returned as it is."""
    if isinstance(device_desc, Machine):
        return device_desc
    try:
        return TARGETS[device_desc]
    except (KeyError, TypeError):
        raise ValueError(
            f"Unknown device {device_desc!r}: use one of "
            f"{', '.join(repr(k) for k in TARGETS)}, or a Machine from "
            "popxl_core.sim.machine.target(). All run on the simulator."
        ) from None
