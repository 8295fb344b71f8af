"""What the multi-process tests run in each process (``python tests/dist_workers.py KIND OUT``),
and, for the references, in the test's own process. See `tests/test_distributed.py`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import popxl_fx
import popxl_fx.fallback
import popxl_fx.poptorch  # for the import check below only

# Each process of a job is a new interpreter that has imported torch and popxl_fx: whether that
# imported torchvision (an optional package whose lowerings register on first use; the job
# prints it, tests/test_distributed.py checks it)
TORCHVISION_WITH_POPXL_FX = "torchvision" in sys.modules
# ... and which of torch's compiler stack it imported: none (popxl_core imports inductor only
# when the fast mode compiles a step; torch.optim imports dynamo on an optimizer's first use).
# With it, the import took 4.9 s of CPU instead of 2.5, in every process that imports the product
COMPILER = ("torch._inductor", "torch._dynamo", "sympy")
COMPILER_WITH_POPXL_FX = sorted(m for m in COMPILER if m in sys.modules)

from tests.fx_zoo import SeedMLP  # noqa: E402

__all__ = ["train_seed_mlp", "rank_share"]


def _without_dynamo_import() -> None:
    """torch's ``Optimizer.add_param_group`` is wrapped so that its first call imports
    torch._dynamo (to exclude it from compilation): ~1.1 s of CPU in each process of a job,
    a third of what the process does. Nothing in these processes compiles, so the method
    runs as is: torch's wrapper calls the function cached in ``__dynamo_disable``."""
    fn = getattr(torch.optim.Optimizer.add_param_group, "__wrapped__", None)
    if fn is not None and "torch._dynamo" not in sys.modules:
        fn.__dynamo_disable = fn


REPLICAS, PER_REPLICA, STEPS = 4, 2, 3


def rank_share(batch: torch.Tensor) -> torch.Tensor:
    """This process's rows of a global batch: with P processes, rank p gets the p-th of P
    contiguous blocks (its replicas' rows; a DistributedSampler-style split)."""
    rank, size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    n = batch.shape[0] // size
    return batch[rank * n : (rank + 1) * n]


def train_seed_mlp(steps: int = STEPS, kill_after: int = -1, seed_by_rank: bool = False) -> dict:
    """The seed MLP trained ``steps`` steps with replication 4 and RTS (Adam: sharded state);
    each process feeds its share of every global batch. Returns losses and final weights.
    ``seed_by_rank``: each process initialises the model from its own seed (rank + 0), as
    an unseeded script would: the trainer starts every process from rank 0's weights."""
    torch.manual_seed(int(_rank()) if seed_by_rank else 0)
    model = SeedMLP()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    options = popxl_fx.Options(
        device="cpu", replication_factor=REPLICAS, replicated_tensor_sharding=True
    )
    trainer = popxl_fx.training_model(model, opt, nn.CrossEntropyLoss(), options)
    g = torch.Generator().manual_seed(1)
    losses = []
    for step in range(steps):
        x = torch.randn(REPLICAS * PER_REPLICA, 1, 28, 28, generator=g)
        y = torch.randint(0, 10, (REPLICAS * PER_REPLICA,), generator=g)
        if step == kill_after:
            print("READY", flush=True)
            os.kill(os.getpid(), 9)  # dies mid-run: the peer waits in the next step
        losses.append(trainer(rank_share(x), rank_share(y)).detach().clone())
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return {"losses": torch.stack(losses), **state}


def run_seed003(batches: int) -> dict:
    """Seed 003, unchanged, through tools/seed_runner.py (every DataLoader capped at
    ``batches``; the loaders' shuffle seeded the same in every run). Returns the trained
    weights the seed reads back and its test accuracy."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import seed_runner

    from popxl_fx.cli import default_seeds_dir

    (path,) = sorted(default_seeds_dir().glob("003_*.txt"))
    torch.manual_seed(0)
    ns = seed_runner.run(path, batches, echo=False).namespace
    weights = {t.name: torch.from_numpy(a.copy()) for t, a in ns["train_vars_to_data"].items()}
    return {**weights, "accuracy": torch.tensor(ns["sum_acc"] / len(ns["test_data"]))}


def core_program() -> dict:
    """A hand-written program over 4 replicas: an all-reduce within groups that span the
    processes ({0, 2}, {1, 3}), a variable grouped the same way, one read back per replica
    (retrieval_mode='all_replicas'), and a remote buffer; 2 runs. Every output and variable."""
    import popxl_core as popxl
    from popxl_core import ops

    ir = popxl.Ir(replication=REPLICAS)
    groups = ir.replica_grouping(stride=2, group_size=2)
    with ir.main_graph:
        xs = popxl.h2d_stream((3,), popxl.float32, "x")
        x = ops.host_load(xs, "x")
        g = popxl.variable(np.array([[1, 2, 3], [4, 5, 6]], np.float32), name="g",
                           replica_grouping=groups.transpose())  # fmt: skip
        every = popxl.variable(np.zeros(3, np.float32), name="every", retrieval_mode="all_replicas")
        buf = popxl.remote_buffer((3,), popxl.float32, entries=1)
        y = ops.collectives.replicated_all_reduce(x * g, "add", group=groups)
        ops.var_updates.accumulate_(every, y)
        ops.remote_store(buf, 0, ops.remote_load(buf, 0) + y)
        ops.host_store(popxl.d2h_stream(y.shape, y.dtype, "y"), y)
        ops.host_store(popxl.d2h_stream((3,), popxl.float32, "r"), ops.remote_load(buf, 0))
    data = np.arange(2 * REPLICAS * 3, dtype=np.float32).reshape(2, REPLICAS, 3) / 7
    out = {}
    with popxl.Session(ir, "ipu_model") as s:
        for i in range(2):
            for stream, a in s.run({xs: data[i]}).items():
                out[f"{stream.tensor_id}{i}"] = torch.from_numpy(a.copy())
        for v in (g, every):
            out[v.name] = torch.from_numpy(s.get_tensor_data(v).copy())
    return out


def bad_input() -> None:
    """Each mistake raises the same error in every process; prints ``OK <name>: <message>``."""
    import popxl_core as popxl
    from popxl_core import ops
    from popxl_core.distributed import InputMismatchError, LaunchError, ProgramMismatchError
    from popxl_core.sim.rendezvous import ReplicaMismatchError

    def session(replicas: int, init: float):
        ir = popxl.Ir(replication=replicas)
        with ir.main_graph:
            w = popxl.variable(np.full((2, 3), init, np.float32), name="w")
            y = ops.collectives.replicated_all_reduce(w, "add")
            ops.host_store(popxl.d2h_stream(y.shape, y.dtype, "y"), y)
        return popxl.Session(ir, "ipu_model")

    def unequal_batches():
        ir = popxl.Ir(replication=2)
        with ir.main_graph:
            xs = popxl.h2d_stream((3,), popxl.float32, "x")
            y = ops.collectives.replicated_all_reduce(ops.host_load(xs, "x"), "add")
            ops.host_store(popxl.d2h_stream(y.shape, y.dtype, "y"), y)
        with popxl.Session(ir, "ipu_model") as s:  # unseeded shuffles: each rank's own batch
            s.run({xs: np.full((2, 3), float(_rank()), np.float32)})

    def different_points():
        s = session(2, 0.0)
        with s:
            s.run()
            if _rank() == "0":  # a read where the other process runs: different exchanges
                s.get_tensor_data(s.ir.main_graph.variables[0])
            else:
                s.run()

    for name, make, error in [
        ("points", different_points, ReplicaMismatchError),
        ("split", lambda: session(3, 0.0), LaunchError),
        ("program", lambda: session(2, float(_rank())), ProgramMismatchError),
        ("inputs", unequal_batches, InputMismatchError),
    ]:
        try:
            make()
        except error as e:
            print(f"OK {name}: " + str(e).replace("\n", " "), flush=True)


def example_losses() -> list:
    """examples/fx_distributed.py: 3 steps (its per-replica DistributedSampler split)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import fx_distributed

    return fx_distributed.train(steps=3)


def _rank() -> str:
    return os.environ.get("RANK", "0")


def _save(result: dict, out: str) -> None:
    np.savez(out, **{k: v.numpy() for k, v in result.items()})


def main(kind: str, out: str) -> None:
    if kind == "job":  # one job for the fast tests: bad input, training, then a kill
        print(f"torchvision imported by popxl_fx: {TORCHVISION_WITH_POPXL_FX}", flush=True)
        print(f"compiler modules imported by the product: {COMPILER_WITH_POPXL_FX}", flush=True)
        bad_input()
        _save(core_program(), out.format("core" + _rank()))
        _save(train_seed_mlp(), out.format(_rank()))
        _save(train_seed_mlp(seed_by_rank=True), out.format("unseeded" + _rank()))
        _save({"losses": torch.tensor(example_losses())}, out.format("example" + _rank()))
        train_seed_mlp(steps=50, kill_after=1 if _rank() == "1" else -1)
    elif kind == "seed003":
        _save(run_seed003(int(os.environ.get("SEED_BATCHES", "4"))), out.format(_rank()))
    else:
        raise SystemExit(f"unknown kind {kind!r}")


if __name__ == "__main__":
    _without_dynamo_import()  # a job's processes only: the test process imports it anyway
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "")
