"""benchmarks.run.time_side_by_side: rotation and both clocks (no assertion on time)."""

from __future__ import annotations

import pytest

from benchmarks.run import CLOCKS, time_side_by_side


@pytest.mark.parametrize("clock", sorted(CLOCKS))
def test_each_side_runs_warmup_plus_repeats_times_in_rotating_order(clock):
    calls = []
    fns = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
    med = time_side_by_side(fns, repeats=4, warmup=2, clock=clock)
    assert sorted(med) == ["a", "b", "c"] and all(v >= 0 for v in med.values())
    assert [calls.count(n) for n in "abc"] == [6, 6, 6]
    firsts = calls[::3]
    assert firsts == ["a", "b", "c", "a", "b", "c"]  # who goes first rotates


def test_unknown_clock_is_refused():
    with pytest.raises(KeyError):
        time_side_by_side({"a": lambda: None}, 1, 0, clock="gpu")


def test_machine_line_names_the_cpu_and_torch():
    from benchmarks.run import machine_line

    line = machine_line()
    assert line.startswith("Machine: ") and "CPUs" in line and "torch " in line
