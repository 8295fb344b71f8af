"""`ReportDiff`: two SimReports side by side, like PopVision's "Compare two Reports".

It shows what a transform saved: outlining (code bytes), batch serialisation and recomputation
(not-always-live peak), phasing and RTS (variable bytes on chip), and what it cost in time.
"""

from __future__ import annotations

from typing import Any, Callable, Tuple

from .units import fmt_bytes, fmt_seconds

__all__ = ["ReportDiff"]

# (key of SimReport.totals(), how to print it)
_ROWS: Tuple[Tuple[str, Callable[[Any], str]], ...] = (
    ("peak_bytes", fmt_bytes),
    ("always_live_bytes", fmt_bytes),
    ("variable_bytes", fmt_bytes),
    ("variables_on_chip_peak_bytes", fmt_bytes),
    ("constant_bytes", fmt_bytes),
    ("code_bytes", fmt_bytes),
    ("stream_buffer_bytes", fmt_bytes),
    ("not_always_live_peak_bytes", fmt_bytes),
    ("streaming_memory_bytes", fmt_bytes),
    ("estimated_cycles", lambda v: f"{v:,}"),
    ("estimated_seconds", fmt_seconds),
    ("flops", lambda v: f"{v:,}"),
    ("host_bytes_in", fmt_bytes),
    ("host_bytes_out", fmt_bytes),
    ("remote_bytes_loaded", fmt_bytes),
    ("remote_bytes_stored", fmt_bytes),
    ("ipu_link_bytes", fmt_bytes),
    ("ops", str),
    ("graphs", str),
)


def _numbers(report) -> dict[str, Any]:
    totals = report.totals()
    return totals | {"peak_bytes": max(totals["peak_bytes_per_ipu"])}


class ReportDiff:
    """The key numbers of two reports, ``a`` then ``b``, with the change from a to b."""

    def __init__(self, a, b, names: tuple[str, str] = ("this", "other")) -> None:
        self.names = names
        na, nb = _numbers(a), _numbers(b)
        self.rows: list[tuple[str, float, float]] = [(k, na[k], nb[k]) for k, _ in _ROWS]
        self.targets = (a.plan.machine.name, b.plan.machine.name)

    def __getitem__(self, key: str) -> tuple[float, float]:
        for k, va, vb in self.rows:
            if k == key:
                return va, vb
        rows = ", ".join(k for k, *_ in self.rows)
        raise KeyError(f"ReportDiff has no row {key!r}; rows: {rows}")

    def ratio(self, key: str) -> float:
        """b / a for one row (inf when a is 0 and b is not)."""
        va, vb = self[key]
        return vb / va if va else (1.0 if vb == va else float("inf"))

    def to_dict(self) -> dict[str, Any]:
        return {
            "names": list(self.names),
            "targets": list(self.targets),
            "rows": {
                k: {self.names[0]: va, self.names[1]: vb, "change": vb - va}
                for k, va, vb in self.rows
            },
        }

    def __str__(self) -> str:
        a, b = self.names
        lines = [f"{'(estimates)':<28} {a:>14} {b:>14} {'change':>16}"]
        for (key, fmt), (_, va, vb) in zip(_ROWS, self.rows):
            if va == vb == 0:
                continue
            change = "same" if va == vb else f"{'+' if vb > va else '-'}{fmt(abs(vb - va))}"
            if va and va != vb:
                change += f" ({100 * (vb - va) / va:+.0f}%)"
            lines.append(f"{key:<28} {fmt(va):>14} {fmt(vb):>14} {change:>16}")
        return "\n".join(lines)

    __repr__ = __str__
