"""`benchmarks/poptorch_overhead.py`'s pairings: every twin runs every step once, in step order
(so the twins train alike and end with the same weights), and "blocks" runs a block of one
twin's steps before the next twin's, the twins' order reversed every round."""

from __future__ import annotations

import pytest

from benchmarks.poptorch_overhead import PAIRINGS, paired_ratio


@pytest.mark.parametrize("pairing", sorted(PAIRINGS))
@pytest.mark.parametrize("rounds, block", [(7, 3), (6, 2), (5, 20)])
def test_each_twin_runs_each_step_once_in_order(pairing, rounds, block):
    order = PAIRINGS[pairing](["a", "b", "c"], rounds, block)
    for twin in "abc":
        assert [step for step, name in order if name == twin] == list(range(rounds))


def test_alternate_runs_one_step_of_each_twin_in_turn():
    assert PAIRINGS["alternate"](["a", "b"], 2, 5) == [(0, "a"), (0, "b"), (1, "a"), (1, "b")]


def test_blocks_run_a_block_of_one_twin_then_the_next_reversing_each_round():
    order = PAIRINGS["blocks"](["a", "b"], 5, 2)
    assert order == [
        (0, "a"), (1, "a"), (0, "b"), (1, "b"),  # round 0: a first
        (2, "b"), (3, "b"), (2, "a"), (3, "a"),  # round 1: b first
        (4, "a"), (4, "b"),  # the last, short block
    ]  # fmt: skip


def test_the_paired_ratio_is_the_median_of_each_steps_ratio():
    # a step slowed on both sides (load moved) stays a ratio of 1; the ratio of the medians
    # would be 3 / 2.25 here
    times = {"poptorch": [2.0, 3.0, 30.0, 3.0], "popxl_fx": [2.0, 2.5, 30.0, 1.0]}
    assert paired_ratio(times, "popxl_fx") == pytest.approx((1.0 + 1.2) / 2)
