"""Data-parallel training with popxl_fx where the replicas are processes (torchrun).

The same script runs its 4 replicas simulated in one process, or as processes of a
torch.distributed job (gloo on CPU), with the same numbers bit for bit:

    python examples/fx_distributed.py                           # 4 replicas, 1 process
    torchrun --nproc_per_node=2 examples/fx_distributed.py      # 2 processes x 2 replicas
    torchrun --nproc_per_node=4 examples/fx_distributed.py      # 4 processes x 1 replica

Under torchrun, ``Options(replication_factor=4)`` gives each process 4/P of the replicas
(`popxl_core.distributed`); each process passes only its share of every global batch, and the
loss that comes back is the mean over all 4 replicas. The data is split the way
``DistributedSampler`` splits it, but per *replica* rather than per process: replica r reads
shard r of 4 (``DistributedSampler(num_replicas=4, rank=r)``) and a process concatenates its
replicas' batches in replica order (`replica_batches`). So the global batch of every step is
the same whatever the number of processes, and so are the losses and the trained weights.
(Splitting per process instead, ``DistributedSampler(num_replicas=P, rank=rank)``, is fine
too; the global batches then depend on P.) Rank 0 prints the losses.

The data here is synthetic (a fixed random teacher labels random images), so the example
needs no download; put your Dataset in its place.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import popxl_fx
from popxl_core.distributed import local_replicas

__all__ = ["REPLICAS", "make_dataset", "replica_batches", "train", "main"]

REPLICAS = 4


def make_dataset(n: int = 512, seed: int = 0) -> TensorDataset:
    """Random 1x28x28 images labelled by a fixed random linear teacher (10 classes)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 28, 28, generator=g)
    teacher = torch.randn(28 * 28, 10, generator=g)
    return TensorDataset(x, (x.reshape(n, -1) @ teacher).argmax(1))


def replica_batches(dataset, replicas: int, batch: int, epoch: int = 0) -> Iterator[tuple]:
    """This process's share of each global batch: for each replica it runs, ``batch`` rows
    from that replica's DistributedSampler shard, concatenated in replica order."""
    loaders = []
    for r in local_replicas(replicas):
        sampler = DistributedSampler(dataset, num_replicas=replicas, rank=r, seed=0)
        sampler.set_epoch(epoch)  # reshuffles each epoch, identically in every process
        loaders.append(DataLoader(dataset, batch_size=batch, sampler=sampler, drop_last=True))
    for parts in zip(*loaders):
        yield tuple(torch.cat(t) for t in zip(*parts))


def train(steps: int = 20, batch: int = 8) -> list[float]:
    """``steps`` SGD steps of a small MLP over ``REPLICAS`` replicas; the losses."""
    torch.manual_seed(0)  # the same initial weights in every process (the Session checks)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    options = popxl_fx.Options(device="cpu", replication_factor=REPLICAS)
    trainer = popxl_fx.training_model(model, opt, F.cross_entropy, options)
    data, losses, epoch = make_dataset(), [], 0
    while len(losses) < steps:
        for x, y in replica_batches(data, REPLICAS, batch, epoch):
            losses.append(float(trainer(x, y)))
            if len(losses) == steps:
                break
        epoch += 1
    return losses


def main(argv=None) -> list[float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args(argv)
    losses = train(args.steps)
    if os.environ.get("RANK", "0") == "0":
        shown = ", ".join(f"{v:.6f}" for v in losses[-3:])
        procs = os.environ.get("WORLD_SIZE", "1")
        print(
            f"{REPLICAS} replicas in {procs} process(es): {len(losses)} steps, last losses "
            f"{shown}; sum of all losses {sum(losses).hex()}"
        )
    return losses


if __name__ == "__main__":
    main()
