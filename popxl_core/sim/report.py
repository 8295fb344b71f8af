"""`SimReport`: the simulator's memory and cycle estimates of a Session, as text or JSON.

Example:
    >>> import popxl_core as popxl
    >>> ir = popxl.Ir()
    >>> with ir.main_graph:
    ...     w = popxl.variable([1.0, 2.0], name="w")
    >>> print(popxl.Session(ir, "ipu_model").report.summary().splitlines()[0])
    IPU memory (estimate, ipu_model: 4 tiles x 624 KiB = 2.44 MiB per IPU, per replica)
"""

from __future__ import annotations

from typing import Any

__all__ = ["SimReport", "fmt_bytes"]


def fmt_bytes(n: float) -> str:
    """Bytes in binary units: ``512 B``, ``624 KiB``, ``2.45 MiB``, ``1.17 GiB``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n // size:.0f} {unit}" if n % size == 0 else f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def _fmt_percent(fraction: float) -> str:
    pct = 100 * fraction
    return f"{pct:.1f}%" if pct >= 0.1 or pct == 0 else f"{pct:.2g}%"


def _fmt_seconds(s: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale:
            return f"{s / scale:.1f} {unit}"
    return f"{s / 1e-9:.1f} ns"


class SimReport:
    """The estimates of one `Plan`: ``summary()`` for people, ``to_dict()`` for tools.

    Every number is an estimate from the simulator's machine model (ipu_model.md §2), as
    the IPU Model's cycle counts are; memory is per IPU of one replica, time per
    ``Session.run`` of one replica (replicas run in parallel).
    """

    def __init__(self, plan) -> None:
        self.plan = plan

    # text ---------------------------------------------------------------------------
    def summary(self) -> str:
        """A compact, human-readable block: memory per IPU, time and work per run."""
        return "\n".join([self._target_line(), *self._memory_lines(), self._time_line(),
                          self._work_line()])

    __str__ = summary

    def __repr__(self) -> str:
        p = self.plan
        return (f"<SimReport {p.machine.name}: {len(p.memory)} IPU(s), "
                f"{p.cycles:,} cycles per run (estimate)>")

    def _target_line(self) -> str:
        m = self.plan.machine
        return (f"IPU memory (estimate, {m.name}: {m.tiles_per_ipu} tiles x "
                f"{fmt_bytes(m.bytes_per_tile)} = {fmt_bytes(m.bytes_per_ipu)} per IPU, "
                "per replica)")

    def _memory_lines(self):
        for ipu, m in self.plan.memory.items():
            line = (f"  IPU {ipu}: variables {fmt_bytes(m.variables)}, constants "
                    f"{fmt_bytes(m.constants)}, code {fmt_bytes(m.code)}, stream buffers "
                    f"{fmt_bytes(m.streams)}, activations peak {fmt_bytes(m.activations)}; "
                    f"total {fmt_bytes(m.total)} ({_fmt_percent(m.fraction)})")
            if m.out_of_memory:
                line += f" OUT OF MEMORY by {fmt_bytes(m.total - m.capacity)}"
            yield line

    def _time_line(self) -> str:
        p, c = self.plan, self.plan.work.cycles
        parts = [f"{name} {getattr(c, name):,}" for name in
                 ("compute", "exchange", "sync", "host", "link", "remote", "control")
                 if getattr(c, name)]
        split = f" ({', '.join(parts)})" if parts else ""
        return (f"Time per run (estimate): {c.total:,} cycles = {_fmt_seconds(p.seconds)} at "
                f"{p.machine.clock_hz / 1e9:.2f} GHz{split}")

    def _work_line(self) -> str:
        p, w = self.plan, self.plan.work
        ops = sum(g.ops for g in p.graphs)
        return (f"Work per run: {w.flops:,} FLOPs; host in {fmt_bytes(w.host_bytes_in)}, out "
                f"{fmt_bytes(w.host_bytes_out)} per replica; {ops} ops in {len(p.graphs)} graph(s)")

    # data ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Everything as plain JSON-serialisable values (IPU keys are strings)."""
        p = self.plan
        m = p.machine
        return {
            "estimate": True,
            "machine": {"name": m.name, "tiles_per_ipu": m.tiles_per_ipu,
                        "bytes_per_tile": m.bytes_per_tile, "bytes_per_ipu": m.bytes_per_ipu,
                        "clock_hz": m.clock_hz, "oom_is_error": m.oom_is_error},
            "replication_factor": p.replication_factor,
            "memory": {str(i): _memory_dict(mem) for i, mem in p.memory.items()},
            "out_of_memory": list(p.out_of_memory),
            "cycles": p.work.cycles.to_dict(),
            "seconds": p.seconds,
            "flops": p.work.flops,
            "host_bytes_in": p.work.host_bytes_in,
            "host_bytes_out": p.work.host_bytes_out,
            "link_bytes": p.work.link_bytes,
            "remote_bytes": p.work.remote_bytes,
            "graphs": [vars(g).copy() for g in p.graphs],
            "ops": [vars(r).copy() for r in p.ops],
            "liveness": [{"step": i, "op": op, "bytes": {str(k): v for k, v in b.items()}}
                         for i, (op, b) in enumerate(zip(p.liveness.steps, p.liveness.curve))],
        }


def _memory_dict(m) -> dict[str, Any]:
    return {"variables": m.variables, "constants": m.constants, "code": m.code,
            "streams": m.streams, "activations_peak": m.activations,
            "always_live": m.always_live, "total": m.total, "capacity": m.capacity,
            "fraction": m.fraction, "out_of_memory": m.out_of_memory,
            "top": [{"category": c, "name": n, "bytes": b} for c, n, b in m.top]}
