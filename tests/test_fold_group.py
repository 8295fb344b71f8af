"""A folded run's group of small all-reduces in buffers kept between runs (`sim/fold_group.py`):
GPT's 53 gradients summed side by side into one kept total whose result views are made once.
Every test compares the folded training run with the replicas' own run
(``CompileOptions(fold_replicas=False)``), 3 steps of SGD with momentum: losses, weights and
optimizer state equal (tolerance 0)."""

from __future__ import annotations

import pytest

from tests.test_replica_folding import FOLD, _off  # noqa: F401 (cached references)
from tests.test_replica_stacking import _assert_same, _train


def _group(session):
    (state,) = session._fold.namespace["RT"].groups.values()
    return state


@pytest.mark.parametrize("replicas", [2, 4])
def test_the_group_keeps_its_total_and_result_views(replicas):
    folded, off = _train("gpt", replicas, FOLD), _off("gpt", replicas)
    _assert_same(folded, off)  # steps 2 and 3 reduced in the kept buffers
    kept = _group(folded[3])["kept"]
    base = kept.total.untyped_storage().data_ptr()
    assert len(kept.results) == 53
    assert all(r.untyped_storage().data_ptr() == base for r in kept.results)
    assert kept.rows.shape == (replicas, kept.total.numel())
