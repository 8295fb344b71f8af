"""The liveness curve as a PNG (matplotlib is optional: ``pip install popxl-fx[plot]``)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["plot_liveness"]


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError(
            "SimReport.plot_liveness needs matplotlib: pip install 'popxl-fx[plot]' "
            "(or pip install matplotlib). report.liveness() gives the same data as a list."
        ) from e
    return plt


def plot_liveness(report, path: Path, ipu: int = 0, title: str | None = None) -> Path:
    """Not-always-live bytes per step (calls and repeats expanded) above the always-live
    floor, with the capacity line and the peak marked."""
    plt = _pyplot()
    steps = report.liveness(ipu)
    mem = report.plan.memory[ipu]
    floor = mem.always_live
    xs = list(range(len(steps)))
    ys = [(floor + b) / _MIB for _, b in steps]
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=100)
    ax.fill_between(xs, 0, [floor / _MIB] * len(xs), step="mid", color="#9ab", label="always-live")
    ax.fill_between(xs, floor / _MIB, ys, step="mid", color="#e83", label="not-always-live")
    _loaded_variables(ax, report, ipu, xs, floor)
    _peak(ax, steps, xs, ys)
    _boundaries(ax, steps)
    ax.set_xlabel("program step (calls and repeats expanded)")
    ax.set_ylabel("MiB on IPU %d" % ipu)
    _capacity(ax, mem.capacity / _MIB, max([*ys, floor / _MIB, 1e-9]) * 1.25)
    ax.set_title(
        title
        or f"Liveness (estimate), {report.plan.machine.name}: capacity "
        f"{mem.capacity / _MIB:.2f} MiB per IPU"
    )
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


_MIB = 1 << 20


def _peak(ax, steps, xs: list[int], ys: list[float]) -> None:
    if steps:
        peak = max(xs, key=lambda i: ys[i])
        ax.annotate(
            f"peak {ys[peak]:.2f} MiB\n{steps[peak][0]}",
            (peak, ys[peak]),
            textcoords="offset points",
            xytext=(5, 5),
            fontsize=8,
        )


def _capacity(ax, cap: float, top: float) -> None:
    """The capacity line; the plot's top kept above it when the curve comes near it."""
    if top > 0.5 * cap:  # near or over capacity: keep the line in view
        top = max(top, 1.05 * cap)
    ax.set_ylim(0, top)
    off = "" if cap <= top else ", above the plot"
    ax.axhline(cap, color="red", ls="--", lw=1, label=f"capacity {cap:.2f} MiB{off}")


def _loaded_variables(ax, report, ipu: int, xs: list[int], floor: int) -> None:
    """Hatch the part of the not-always-live bytes that is remote variables loaded on chip
    (phased execution), when there is any. Inside a call the curve holds the call's most,
    so it is clipped to what is live at each of its steps."""
    live = [b for _, b in report.liveness(ipu)]
    loaded = [min(b, n) for (_, b), n in zip(report.loaded_variables(ipu), live)]
    if not any(loaded):
        return
    mib = 1 << 20
    ax.fill_between(
        xs,
        floor / mib,
        [(floor + b) / mib for b in loaded],
        step="mid",
        facecolor="none",
        edgecolor="#235",
        hatch="///",
        lw=0,
        label="of which remote variables loaded",
    )


def _boundaries(ax, steps: list[tuple[str, int]]) -> None:
    """Dotted lines where the step path enters or leaves a call or repeat."""
    prev = None
    for i, (name, _) in enumerate(steps):
        parent = name.rpartition("/")[0]
        if prev is not None and parent != prev:
            ax.axvline(i - 0.5, color="grey", ls=":", lw=0.6)
        prev = parent
