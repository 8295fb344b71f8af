"""Random ops and host seeds: determinism, seed sensitivity, statistics, dropout gradients."""

from __future__ import annotations

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core import ops, transforms
from popxl_core.random_seed import (
    MAX_UINT64,
    create_seeds,
    two_uint32_to_uint64,
    uint64_to_two_uint32,
)


def _run(build, seeds, extra=None):
    """Build ``build(seed_tensor)`` in the main graph; run once per seed; outputs per run."""
    ir = popxl.Ir()
    with ir.main_graph:
        seed_stream = popxl.h2d_stream((2,), popxl.uint32, "seed")
        outs = build(ops.host_load(seed_stream, "seed"))
        outs = outs if isinstance(outs, tuple) else (outs,)
        streams = []
        for i, t in enumerate(outs):
            streams.append(popxl.d2h_stream(t.shape, t.dtype, f"out{i}"))
            ops.host_store(streams[-1], t)
    session = popxl.Session(ir, "ipu_hw")
    with session:
        return [[session.run({seed_stream: s})[st] for st in streams] for s in seeds]


# create_seeds -----------------------------------------------------------------------------
def test_create_seeds_shapes_and_dtype():
    assert create_seeds(1).shape == (2,)
    assert create_seeds(1, replicas=4).shape == (4, 2)
    assert create_seeds(
        1, batches_per_step=3, gradient_accumulation_factor=2, replicas=4
    ).shape == (3, 2, 4, 2)
    assert create_seeds(1, batches_per_step=3, replicas=1).shape == (3, 2)
    assert create_seeds(1).dtype == np.uint32


def test_create_seeds_draws_uint64_from_default_rng():
    want = np.random.default_rng(7 + 3).integers(0, 2**64, size=2, dtype=np.uint64)
    got = create_seeds(7, offset=3, replicas=2)
    assert [two_uint32_to_uint64(*w) for w in got] == [int(v) for v in want]


def test_create_seeds_deterministic_and_offset_sensitive():
    np.testing.assert_array_equal(create_seeds(5, replicas=3), create_seeds(5, replicas=3))
    assert not np.array_equal(create_seeds(5), create_seeds(5, offset=1))
    assert not np.array_equal(create_seeds(5), create_seeds(6))


def test_uint64_words_round_trip():
    for v in (0, 1, 2**32 - 1, 2**32, 2**64 - 1, 0x0123456789ABCDEF):
        # PopXL's signatures: a (high, low) tuple of ints and two words back
        words = uint64_to_two_uint32(v)
        assert isinstance(words, tuple) and len(words) == 2
        assert two_uint32_to_uint64(*words) == v
    assert uint64_to_two_uint32(2**32 + 7) == (1, 7) and MAX_UINT64 == 2**64 - 1
    with pytest.raises(ValueError):
        uint64_to_two_uint32(2**64)
    with pytest.raises(ValueError):
        create_seeds(1, replicas=0)


# random_uniform / random_normal -----------------------------------------------------------
def test_random_uniform_statistics_and_determinism():
    s1, s2 = create_seeds(1), create_seeds(2)
    (a,), (b,), (c,) = _run(lambda s: ops.random_uniform(s, (400, 500), -2.0, 3.0), [s1, s1, s2])
    assert a.shape == (400, 500) and a.dtype == np.float32
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert a.min() >= -2.0 and a.max() < 3.0
    assert abs(a.mean() - 0.5) < 0.02
    assert abs(a.std() - 5.0 / np.sqrt(12.0)) < 0.02
    assert abs(np.corrcoef(a.ravel(), c.ravel())[0, 1]) < 0.01


def test_random_normal_statistics_and_determinism():
    s1, s2 = create_seeds(3), create_seeds(4)
    (a,), (b,), (c,) = _run(lambda s: ops.random_normal(s, (400, 500), 1.5, 0.25), [s1, s1, s2])
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert abs(a.mean() - 1.5) < 0.005
    assert abs(a.std() - 0.25) < 0.005
    assert abs(np.mean(np.abs(a - 1.5) < 0.25) - 0.6827) < 0.01  # one-sigma mass


def test_random_float16_output():
    ((a,),) = _run(
        lambda s: ops.random_uniform(s, (100, 100), dtype=popxl.float16), [create_seeds(5)]
    )
    assert a.dtype == np.float16 and 0.0 <= a.min() and a.max() <= 1.0


def test_seeds_differing_only_in_the_high_word_differ():
    (a,), (b,) = _run(
        lambda s: ops.random_uniform(s, (64,)),
        [np.array([1, 9], np.uint32), np.array([2, 9], np.uint32)],
    )
    assert not np.array_equal(a, b)


# dropout ----------------------------------------------------------------------------------
def test_dropout_statistics_scaling_and_determinism():
    x = np.random.default_rng(0).uniform(1.0, 2.0, (300, 400)).astype(np.float32)
    p = 0.3

    def build(s):
        return ops.dropout(popxl.constant(x), s, p)

    s1, s2 = create_seeds(10), create_seeds(11)
    (a,), (b,), (c,) = _run(build, [s1, s1, s2])
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a == 0, c == 0)
    dropped = a == 0
    assert abs(dropped.mean() - p) < 0.01
    np.testing.assert_allclose(a[~dropped], x[~dropped] / (1 - p), rtol=1e-6)
    assert abs(a.mean() / x.mean() - 1.0) < 0.01


def test_dropout_gradient_uses_the_forward_mask():
    x = np.random.default_rng(1).uniform(1.0, 2.0, (50, 60)).astype(np.float32)
    dy = np.random.default_rng(2).uniform(1.0, 2.0, (50, 60)).astype(np.float32)
    p = 0.4

    def build(seed):
        xv = popxl.variable(x, name="x")
        graph = popxl.gir().create_graph(
            lambda t, s: ops.dropout(t, s, p), xv.spec, popxl.TensorSpec((2,), popxl.uint32)
        )
        bwd = transforms.autodiff(graph, grads_required=[graph.inputs[0]])
        site = ops.call_with_info(graph, xv, seed)
        (dx,) = ops.call(bwd.graph, popxl.constant(dy), inputs_dict=bwd.inputs_dict(site))
        return site.outputs[0], dx

    for k in (20, 21):
        ((y, dx),) = _run(build, [create_seeds(k)])
        kept = y != 0
        assert 0.5 < kept.mean() < 0.7
        np.testing.assert_array_equal(dx != 0, kept)
        np.testing.assert_allclose(dx[kept], dy[kept] / (1 - p), rtol=1e-6)


def test_shaped_dropout_drops_whole_slices():
    x = np.ones((8, 16, 10), np.float32)
    ((a,),) = _run(
        lambda s: ops.shaped_dropout(popxl.constant(x), s, [8, 1, 10], 0.5), [create_seeds(30)]
    )
    column_dropped = a[:, 0, :] == 0
    assert 0 < column_dropped.mean() < 1
    for j in range(16):
        np.testing.assert_array_equal(a[:, j, :] == 0, column_dropped)


def test_dropout_p0_is_identity():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    ((a,),) = _run(lambda s: ops.dropout(popxl.constant(x), s, 0.0), [create_seeds(1)])
    np.testing.assert_array_equal(a, x)


# split_random_seed ------------------------------------------------------------------------
def test_split_random_seed_is_deterministic_and_distinct():
    s = create_seeds(40)
    runs = _run(lambda seed: ops.split_random_seed(seed, 4), [s, s, create_seeds(41)])
    first, again, other = ([tuple(w) for w in run] for run in runs)
    assert first == again
    assert len(set(first)) == 4 and tuple(s) not in first
    assert set(first).isdisjoint(other)
    assert all(np.asarray(w).dtype == np.uint32 for w in runs[0])


def test_split_seeds_give_different_dropout_masks():
    x = np.ones((40, 50), np.float32)

    def build(seed):
        s1, s2 = ops.split_random_seed(seed)
        t = popxl.constant(x)
        return ops.dropout(t, s1, 0.5), ops.dropout(t, s2, 0.5)

    ((a, b),) = _run(build, [create_seeds(50)])
    assert not np.array_equal(a == 0, b == 0)


def test_split_random_seed_creates_modify_random_seed_ops():
    ir = popxl.Ir()
    with ir.main_graph:
        seed = popxl.variable(create_seeds(1), popxl.uint32, name="seed")
        seeds = ops.split_random_seed(seed, 3)
    assert len(seeds) == 3
    assert [t.producer.type for t in seeds] == ["ModifyRandomSeed"] * 3
