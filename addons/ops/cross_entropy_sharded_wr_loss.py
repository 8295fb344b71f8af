"""Cross entropy over logits sharded along the class axis across the IPUs of one replica
(popxl.addons' ``cross_entropy_sharded_wr_loss``, "within replica"; there one C++ op,
``CrossEntropyShardedWR``, and its grad op).

Shard ``i`` (``(n_samples, classes_i)``, shards of any widths) and a copy of the labels live
on IPU ``ipus[i]``; the labels are the whole vocabulary's, shifted per shard by the op. As in
``CrossEntropySharded`` the max of the logits and the sum of the exponentials are reduced
across the shards (here over the IPU-Links, Graphcore's ``allReduceWithinReplica``); each
shard takes ``-log_softmax`` at the labels it holds, and the partial losses are summed onto
``ipus[0]``. Outputs: the loss ``(n_samples,)`` on ``ipus[0]`` and each shard's negative
log-softmax on its IPU, which the grad op reads (the loss gradient is sent to every shard).
"""

from __future__ import annotations

import functools
from typing import Iterable, List, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

import popxl_core as popxl
from popxl_core import Tensor, TensorSpec
from popxl_core.ops.registry import Cost, OpDef, Sample, create_op, register
from popxl_core.sim.ring import IPU_LINKS

from .cross_entropy_sharded_loss import label_values, softmax_grad
from .exchanging_kernel import table_kernel, widened

__all__ = [
    "cross_entropy_sharded_wr_loss",
    "CROSS_ENTROPY_SHARDED_WR",
    "CROSS_ENTROPY_SHARDED_GRAD_WR",
]


def _infer(ins, ipus):
    n = len(ipus)
    logits, indices = ins[:n], ins[n:]
    rows = logits[0].shape[0] if logits and len(logits[0].shape) == 2 else None
    if len(ins) != 2 * n or rows is None:
        raise ValueError(f"takes {n} logits (n_samples, classes) and {n} indices (n_samples,)")
    for t in logits:
        if len(t.shape) != 2 or t.shape[0] != rows or t.dtype != logits[0].dtype:
            raise ValueError(f"logits shard {t.shape} {t.dtype.name} differs from the first's")
    for t in indices:
        if tuple(t.shape) != (rows,) or t.dtype.is_floating_point:
            raise ValueError(f"indices {t.shape} {t.dtype.name}: want integers ({rows},)")
    return [TensorSpec((rows,), logits[0].dtype), *logits]


def _offsets(widths: Sequence[int]) -> List[int]:
    """Each shard's first class."""
    return [int(sum(widths[:i])) for i in range(len(widths))]


def _kernel(*ins, ipus, exp=None, log=None):
    n = len(ipus)
    exp, log = exp or table_kernel("Exp", "ipu"), log or table_kernel("Log", "ipu")
    xs = [widened(t) for t in ins[:n]]
    top = functools.reduce(torch.maximum, [x.amax(-1, keepdim=True) for x in xs])
    shifted = [x - top for x in xs]
    total = functools.reduce(torch.add, [exp(s).sum(-1, keepdim=True) for s in shifted])
    nls = [log(total) - s for s in shifted]
    starts = _offsets([x.shape[-1] for x in xs])
    parts = [label_values(v, i.long() - s) for v, i, s in zip(nls, ins[n:], starts)]
    dtype = ins[0].dtype
    return (functools.reduce(torch.add, parts).to(dtype), *[v.to(dtype) for v in nls])


def _grad(ctx):
    n = len(ctx.attrs["ipus"])
    if any(ctx.grad_output(i) is not None for i in range(1, n + 1)):
        raise NotImplementedError(
            "CrossEntropyShardedWR: no gradient through its negative log-softmax outputs"
        )
    nls = [ctx.output(i) for i in range(1, n + 1)]
    labels = [ctx.input(n + i) for i in range(n)]
    return [*_create_grad(ctx.grad_output_or_zero(0), nls, labels, ctx.attrs["ipus"]), *[None] * n]


def _grad_infer(ins, ipus):
    n = len(ipus)
    dloss, nls = ins[0], ins[1 : n + 1]
    if len(ins) != 1 + 2 * n or any(t.shape[0] != dloss.shape[0] for t in nls):
        raise ValueError(f"takes dloss, {n} negative log-softmax shards and {n} indices")
    return list(nls)


def _grad_kernel(dloss, *ins, ipus, exp=None):
    n = len(ipus)
    exp = exp or table_kernel("Exp", "ipu")
    nls, labels = ins[:n], ins[n:]
    starts = _offsets([v.shape[-1] for v in nls])
    grads = [softmax_grad(dloss, v, i.long() - s, exp) for v, i, s in zip(nls, labels, starts)]
    return tuple(g.to(v.dtype) for g, v in zip(grads, nls))


def _cost(ins, outs, attrs) -> Cost:
    """The shards compute at once, one per IPU: the widest shard's work (max, subtract, exp,
    sum, log-subtract per logit), read twice and written once."""
    n = len(attrs["ipus"])
    logits = max(ins[:n], key=lambda s: s.nelms)
    return Cost(5 * logits.nelms, 3 * logits.nbytes + ins[n].nbytes + outs[0].nbytes)


def _grad_cost(ins, outs, attrs) -> Cost:
    widest = max(outs, key=lambda s: s.nelms)
    return Cost(3 * widest.nelms + ins[0].nelms, 2 * widest.nbytes + 2 * ins[0].nbytes)


def _links(ins, outs, attrs) -> int:
    """Over the IPU-Links: the max and the sum all-reduced across the shards (a ring, each
    2 (n-1)/n of a value per sample) and the n-1 partial losses sent to the first IPU."""
    n, per_sample = len(attrs["ipus"]), outs[0].nbytes
    return 2 * (2 * (n - 1) * per_sample // n) + (n - 1) * per_sample


def _grad_links(ins, outs, attrs) -> int:
    """The loss gradient sent from the first IPU to the n-1 others."""
    return (len(attrs["ipus"]) - 1) * ins[0].nbytes


def _on_ipus(build):
    """A sample's op on IPUs 0 and 1: the second shard and labels copied to IPU 1."""

    def on_ipus(x0, x1, labels):
        return build([x0, x1.copy_to_ipu(1)], [labels, labels.copy_to_ipu(1)])

    return on_ipus


def _samples():
    """Two shards of uneven widths (5 and 4 of 9 classes) on IPUs 0 and 1, against torch's
    cross entropy over all the classes, at a few ulps (`cross_entropy_sharded_loss`'s)."""
    rng = np.random.default_rng(40)
    x = rng.uniform(-3, 3, (6, 9)).astype(np.float32)
    labels = rng.integers(0, 9, 6).astype(np.uint32)

    def ref(x0, x1, i):
        return F.cross_entropy(torch.cat([x0, x1], 1), i.long(), reduction="none")

    build = _on_ipus(lambda xs, ls: cross_entropy_sharded_wr_loss(xs, ls))
    return [Sample([x[:, :5], x[:, 5:], labels], build, ref, rtol=3e-7, atol=3e-8)]


def _grad_samples():
    rng = np.random.default_rng(41)
    x = rng.uniform(-3, 3, (5, 7)).astype(np.float32)
    labels = rng.integers(0, 7, 5).astype(np.uint32)
    dloss = rng.standard_normal(5).astype(np.float32)

    def build(g, x0, x1, i):
        fwd = _on_ipus(lambda xs, ls: (_create(xs, ls, (0, 1))[1:], ls))
        nls, ls = fwd(x0, x1, i)
        return tuple(_create_grad(g, nls, ls, (0, 1)))

    def ref(g, x0, x1, i):
        xs = [t.detach().requires_grad_() for t in (x0, x1)]
        with torch.enable_grad():
            loss = F.cross_entropy(torch.cat(xs, 1), i.long(), reduction="none")
            return torch.autograd.grad(loss, xs, g)

    inputs = [dloss, x[:, :4], x[:, 4:], labels]
    return [Sample(inputs, build, ref, grad=False, rtol=3e-7, atol=3e-8)]


def _torch_kernel(*ins, ipus):
    """``Ir.numerics == "torch"``: torch's own exp and log (no position-invariant padding)."""
    return _kernel(*ins, ipus=ipus, exp=torch.exp, log=torch.log)


def _torch_grad_kernel(*ins, ipus):
    return _grad_kernel(*ins, ipus=ipus, exp=torch.exp)


CROSS_ENTROPY_SHARDED_WR = register(
    OpDef(
        "CrossEntropyShardedWR",
        _infer,
        _kernel,
        grad=_grad,
        cost=_cost,
        samples=_samples,
        numerics_kernels={"torch": _torch_kernel},
    )
)
IPU_LINKS.register(CROSS_ENTROPY_SHARDED_WR, _links)
CROSS_ENTROPY_SHARDED_GRAD_WR = register(
    OpDef(
        "CrossEntropyShardedGradWR",
        _grad_infer,
        _grad_kernel,
        cost=_grad_cost,
        samples=_grad_samples,
        out_name="cross_entropy_sharded_grad_out",
        numerics_kernels={"torch": _torch_grad_kernel},
    )
)
IPU_LINKS.register(CROSS_ENTROPY_SHARDED_GRAD_WR, _grad_links)


def _create(logits: List[Tensor], indices: List[Tensor], ipus: Sequence[int]) -> List[Tensor]:
    names = ["cross_entropy_sharded_out"]
    names += [f"cross_entropy_sharded_soft_max_out_{i}" for i in range(len(ipus))]
    with popxl.ipu(ipus[0]):
        return create_op(
            CROSS_ENTROPY_SHARDED_WR,
            [*logits, *indices],
            {"ipus": tuple(ipus)},
            out_names=names,
            check_placement=False,
            out_ipus=[ipus[0], *ipus],
        )


def _create_grad(dloss: Tensor, nls, labels, ipus: Sequence[int]) -> List[Tensor]:
    with popxl.ipu(ipus[0]):
        return create_op(
            CROSS_ENTROPY_SHARDED_GRAD_WR,
            [dloss, *nls, *labels],
            {"ipus": tuple(ipus)},
            check_placement=False,
            out_ipus=list(ipus),
        )


def _ipus_of(ts: List[Tensor], ipus: Optional[Iterable[int]]) -> List[int]:
    ipus = [t.ipu for t in ts] if ipus is None else [int(i) for i in ipus]
    if len(ipus) != len(ts):
        raise ValueError(f"{len(ts)} tensors but {len(ipus)} IPUs given")
    return ipus


def cross_entropy_sharded_wr_loss(
    logits: List[Tensor], indices: List[Tensor], ipus: Optional[Iterable[int]] = None
) -> Tensor:
    """Cross entropy of ``logits`` sharded along the classes across IPUs of one replica
    (shard ``i``: ``(n_samples, classes_i)`` on ``ipus[i]``, default each shard's IPU)
    against ``indices`` (the whole vocabulary's labels, a copy on each shard's IPU): the
    unreduced loss ``(n_samples,)`` on ``ipus[0]``."""
    if len(logits) != len(indices):
        raise ValueError("You must provide the same number of logits and indices.")
    return _create(list(logits), list(indices), _ipus_of(logits, ipus))[0]
