"""The fixed costs in the machine table are the fit to Graphcore's published MNIST timings.

Published (ipu_model.md §2, tutorial "remote variables and RTS"): training 3.37 ms per step
(4 replicas x accumulation 4 x micro-batch 8), inference at batch 80 0.80 ms per step. The
training program's Streaming-Memory part is added analytically until remote buffers land.
"""

from dataclasses import replace

import pytest

from popxl_core.sim import calibration
from popxl_core.sim.machine import BOW, MK2


@pytest.fixture(scope="module")
def fitted():
    return calibration.fit(MK2)


def test_the_fit_meets_both_figures_with_positive_costs(fitted):
    assert fitted.run_overhead_s > 0 and fitted.host_latency_s > 0
    # two unknowns, two equations: exact up to the ceil() of each op's cycles
    assert max(abs(e) for e in fitted.errors().values()) < 1e-4


def test_machine_table_holds_the_fitted_constants_rounded(fitted):
    # the table rounds to 1 us: within 0.5 us of the fit
    assert MK2.run_overhead_s == pytest.approx(fitted.run_overhead_s, abs=0.5e-6)
    assert MK2.host_latency_s == pytest.approx(fitted.host_latency_s, abs=0.5e-6)
    assert BOW.run_overhead_s == MK2.run_overhead_s  # host-side costs, in seconds


def test_estimates_are_within_10_percent_of_the_published_figures():
    estimates = calibration.check(MK2)
    for name, published in calibration.PUBLISHED_S.items():
        assert estimates[name] == pytest.approx(published, rel=0.10), name
    # and well within: the table's rounding moves each by under 0.5 %
    assert estimates["inference"] == pytest.approx(0.80e-3, rel=0.005)
    assert estimates["training"] == pytest.approx(3.37e-3, rel=0.005)


def test_fixed_costs_dominate_the_small_mlp_as_published():
    bare = replace(MK2, run_overhead_s=0.0, host_latency_s=0.0)
    flops_only = calibration.check(bare)["inference"]
    assert flops_only < 0.1 * calibration.PUBLISHED_S["inference"]


def test_streaming_memory_term_counts_rts_shards():
    work = calibration.streaming_memory_work(MK2, replicas=4)
    n_params = 932_362  # the golden Ψ of ipu_model.md §4
    shard_bytes = sum(-(-n // 4) for n in _param_sizes()) * (4 + 2 + 4)
    assert work.remote_bytes_loaded == work.remote_bytes_stored == shard_bytes
    assert sum(_param_sizes()) == n_params
    # all-gather + reduce-scatter, (R-1)/R of every float32 tensor each
    assert work.link_bytes == sum(2 * -(-3 * n * 4 // 4) for n in _param_sizes())


def _param_sizes():
    layers = calibration.LAYERS
    sizes = []
    for a, b in zip(layers, layers[1:]):
        sizes += [a * b, b]
    return sizes


def test_rts_shards_follow_the_padding_rule():
    from popxl_core.sim.cost import rts_shard

    # [5, 2, 3] over 4 replicas: 8, 8, 7 + pad, 7 + pad (ipu_model.md §4)
    assert rts_shard(30, 4) == 8 and 4 * rts_shard(30, 4) - 30 == 2
    assert rts_shard(32, 4) == 8 and rts_shard(1, 4) == 1 and rts_shard(7, 1) == 7
    with pytest.raises(ValueError, match="replicas must be >= 1, got 0"):
        rts_shard(4, 0)
