"""Replicas as processes (`popxl_core.distributed`): jobs of 2 processes on 127.0.0.1, launched
as torchrun does (environment variables; `tests/dist_launch.py`), against the same program with
all replicas simulated in one process. Every job is bounded (JOB_BOUND_S) and killed past it.

Tolerance: none. The processes exchange raw bytes and reduce in replica order, so losses and
weights are bit-identical to the one-process simulation run with the same number of torch
threads (one here, as in the launched processes: torch's CPU kernels may round differently
with another thread count, in one process as in several).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dist_launch import finish, start

import popxl_core as popxl
from popxl_core.distributed import LaunchError
from popxl_fx.cli import default_seeds_dir

JOB_BOUND_S = 300.0  # a loaded 2-core machine imports torch twice in ~20 s
COLLECTIVE_TIMEOUT_S = 20  # POPXL_COLLECTIVE_TIMEOUT of the kill test's job
WORKERS = "tests/dist_workers.py"


def _ok(done) -> None:
    for d in done:
        assert d.returncode == 0, f"rank {d.rank} failed:\n{d.stderr[-4000:]}"


def _assert_same(ref: dict, path: Path) -> None:
    got = np.load(path)
    assert sorted(got.files) == sorted(ref), (sorted(got.files), sorted(ref))
    for k, v in ref.items():
        want = v.numpy() if isinstance(v, torch.Tensor) else v
        assert got[k].dtype == want.dtype and got[k].shape == want.shape, k
        assert got[k].tobytes() == want.tobytes(), (
            f"{k} differs from the one-process run: max |diff| "
            f"{np.abs(got[k].astype(np.float64) - want).max()}"
        )


def _one_thread(fn):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn()
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """One 2-process job for the fast tests (`dist_workers.main("job")`): the bad launches,
    3 training steps of the seed MLP, then a second training in which rank 1 kills itself.
    The one-process reference trains here while the job runs."""
    from dist_workers import core_program, example_losses, train_seed_mlp

    out = tmp_path_factory.mktemp("dist")
    env = {"POPXL_COLLECTIVE_TIMEOUT": str(COLLECTIVE_TIMEOUT_S)}
    procs = start([WORKERS, "job", str(out / "rank{}.npz")], 2, env)
    ref = _one_thread(train_seed_mlp)  # 4 replicas in this process
    ref_example = {"losses": torch.tensor(_one_thread(example_losses))}
    ref_core = _one_thread(core_program)
    procs[1].wait(timeout=JOB_BOUND_S)
    died = time.monotonic()
    done = finish(procs, COLLECTIVE_TIMEOUT_S + 30.0)
    return done, time.monotonic() - died, out, ref, ref_example, ref_core


def test_two_processes_train_the_seed_mlp_like_four_simulated_replicas(job):
    """Replication 4 (2 replicas per process), RTS (Adam state sharded over the 4 replicas):
    losses and final weights bit for bit those of 4 replicas in one process."""
    done, _, out, ref, *_ = job
    assert len(ref["losses"]) == 3
    for rank in (0, 1):
        assert (out / f"rank{rank}.npz").exists(), done[rank].stderr[-3000:]
        _assert_same(ref, out / f"rank{rank}.npz")


def test_processes_started_from_different_weights_all_train_from_rank_0s(job):
    """Each process seeds its model differently (an unseeded script): every process takes
    rank 0's initial weights, as DistributedDataParallel does, so losses and final weights
    are those of the one-process run from rank 0's seed; the process whose weights were
    replaced says so, naming them. Before, each process trained replicas from its own weights,
    gradients averaged over both."""
    done, _, out, ref, *_ = job
    for rank in (0, 1):
        assert (out / f"rankunseeded{rank}.npz").exists(), done[rank].stderr[-3000:]
        _assert_same(ref, out / f"rankunseeded{rank}.npz")
    said = "differed from process rank 0's and now hold rank 0's values"
    assert said not in done[0].stderr
    assert said in done[1].stderr and "fc1.weight" in done[1].stderr, done[1].stderr[-3000:]


def test_a_killed_process_makes_the_other_fail_naming_its_rank(job):
    """Rank 1 kills itself (SIGKILL) after its first step; rank 0, at the next collective,
    raises PeerFailureError naming rank 1 and the collective, well within the timeout (the
    job's bound is the timeout + 30 s)."""
    (rank0, rank1), after, *_ = job
    print(f"rank 0 exited {after:.2f} s after rank 1 died")
    assert rank1.returncode == -9 and "READY" in rank1.stdout, rank1.stderr[-3000:]
    assert rank0.returncode not in (0, None, -9), rank0.stderr[-2000:]
    last = rank0.stderr.strip().splitlines()[-1]
    assert "PeerFailureError: Process rank 0" in last, rank0.stderr[-3000:]
    assert "process rank 1 stopped answering" in last
    assert "collective Replicated" in last  # the collective it waited at, named
    assert f"at most {COLLECTIVE_TIMEOUT_S} s" in last


def test_the_example_gives_the_same_losses_in_two_processes(job):
    """examples/fx_distributed.py (4 replicas, per-replica DistributedSampler shards)."""
    done, _, out, _, ref, _ = job
    for rank in (0, 1):
        assert (out / f"rankexample{rank}.npz").exists(), done[rank].stderr[-3000:]
        _assert_same(ref, out / f"rankexample{rank}.npz")


def test_groups_across_processes_all_replicas_reads_and_remote_buffers(job):
    """`dist_workers.core_program`: an all-reduce in groups {0, 2}, {1, 3} (each spans both
    processes), a grouped variable, retrieval_mode='all_replicas' (one row per replica,
    gathered) and a remote buffer: every output and variable equal to one process's."""
    done, _, out, _, _, ref = job
    for rank in (0, 1):
        assert (out / f"rankcore{rank}.npz").exists(), done[rank].stderr[-3000:]
        _assert_same(ref, out / f"rankcore{rank}.npz")
    assert ref["every"].shape == (4, 3) and ref["g"].shape == (2, 3)


def test_bad_launches_fail_in_every_process_saying_what_to_do(job):
    """Replication 3 over 2 processes, programs that differ (rank 1's initial weights), the
    processes at different exchanges (a read in one, a run in the other), and whole-batch
    inputs that differ between the processes (unseeded shuffling)."""
    for d in job[0]:
        lines = d.stdout.splitlines()
        assert any(
            "OK split: Ir(replication=3) does not split over the 2 processes" in x
            and "Launch 1 or 3 processes" in x
            for x in lines
        ), d.stdout
        assert any(
            "OK program: The processes built different programs: at line 5, rank 0 has" in x
            and "variable w (2, 3) float32 initial value" in x
            and "and rank 1 has" in x
            for x in lines
        ), d.stdout
        assert any(
            "OK points: The processes reached different exchanges (rank 0 at variable values" in x
            and "rank 1 at collective ReplicatedAllReduce" in x
            for x in lines
        ), d.stdout
        assert any(
            "OK inputs: Session.run: stream 'x' got different data in ranks 0 and 1" in x
            and "torch.manual_seed" in x
            for x in lines
        ), d.stdout


def test_import_popxl_fx_does_not_import_torchvision(job):
    """A new interpreter that imports torch and popxl_fx (each process of the job, before
    anything else) has not imported torchvision: its lowerings register on first use
    (tests/test_fx_lowering_optional.py)."""
    for d in job[0]:
        assert "torchvision imported by popxl_fx: False" in d.stdout, d.stdout[-2000:]


def test_the_product_imports_none_of_torchs_compiler(job):
    """Nor torch._inductor, torch._dynamo or sympy (with popxl_fx.poptorch too): the fast
    mode imports inductor when it compiles (sim/inductor_step.py), and a torch optimizer
    imports dynamo when first used, neither at import."""
    for d in job[0]:
        assert "compiler modules imported by the product: []" in d.stdout, d.stdout[-2000:]


@pytest.fixture(scope="module")
def seed003() -> Path:
    found = sorted(default_seeds_dir().glob("003_*.txt"))
    if not found:
        pytest.skip(f"seed 003 not found in {default_seeds_dir()} (set POPXL_FX_SEEDS_DIR)")
    return found[0]


@pytest.mark.slow
def test_seed003_runs_its_two_replicas_as_two_processes(seed003, tmp_path, monkeypatch):
    """Seed 003 unchanged (tools/seed_runner.py) with its 2 replicas as 2 processes: the weights
    it reads back and its test accuracy equal the one-process run's, bit for bit."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import seed_runner

    monkeypatch.setenv("HOME", str(tmp_path))  # the seed reads ~/.torch/datasets
    seed_runner.stage_data()  # once, before the processes read it
    env = {"HOME": str(tmp_path), "SEED_BATCHES": "3", "POPXL_FX_SEEDS_DIR": str(seed003.parent)}
    out = str(tmp_path / "p{}_rank{{}}.npz")
    jobs = [start([WORKERS, "seed003", out.format(n)], n, env) for n in (2, 1)]
    for job in jobs:
        _ok(finish(job, JOB_BOUND_S))
    ref = dict(np.load(tmp_path / "p1_rank0.npz"))
    assert any(k.startswith("fc1") for k in ref) and "accuracy" in ref
    for rank in (0, 1):
        _assert_same(ref, tmp_path / f"p2_rank{rank}.npz")


def test_popdist_without_a_launcher_says_how_to_launch(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    ir = popxl.Ir(replication="popdist")
    assert ir.replication_factor == 1
    with pytest.raises(LaunchError, match=r"replication='popdist'.*torchrun --nproc_per_node"):
        popxl.Session(ir, "ipu_model")


def test_one_process_keeps_every_replica(monkeypatch):
    """Outside a job (or with POPXL_DISTRIBUTED=0) the Session simulates all replicas."""
    monkeypatch.setenv("POPXL_DISTRIBUTED", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")  # a launcher's variable alone changes nothing
    ir = popxl.Ir(replication=4)
    assert ir.instance_replication_factor == 4
