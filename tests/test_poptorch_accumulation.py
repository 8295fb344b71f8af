"""popxl_fx.poptorch: a training call's outputs with gradient accumulation and replication,
as PopTorch returns them, compared with eager torch bit for bit (tolerance 0).

PopTorch's combined batch is PopART's ``[iterations, micro-batches, replicas, rows]``: each
micro-batch's outputs come back (per the output mode: Final, the last micro-batch's; All,
every micro-batch's concatenated; Sum; EveryN), one loss per replica (``[R]``). Eager does
the same split by hand: the micro-batches of a step and their replicas run one after the
other on the step's weights, the gradients combined as popxl_fx combines them (each
replica's mean over its micro-batches, then the mean over replicas), one optimizer step.
"""

from __future__ import annotations

import copy

import pytest
import torch

import popxl_fx
import popxl_fx.poptorch as poptorch
from tests.test_poptorch_executors import LossOnly, Net, _data


def _eager_steps(model, x, t, n: int, k: int, r: int, lr: float = 0.1):
    """Eager torch on PopTorch's combined batch: n steps of k micro-batches of r replicas;
    returns every micro-batch's (outputs, loss) per replica, ``[n * k][r]``, in order."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    params = list(model.parameters())
    results = []
    chunks = list(zip(x.chunk(n * k * r), t.chunk(n * k * r)))
    for step in range(n):
        grads = [[None] * r for _ in range(k)]
        for j in range(k):
            row = []
            for i in range(r):
                xs, ts = chunks[(step * k + j) * r + i]
                out, loss = model(xs, ts)
                grads[j][i] = torch.autograd.grad(loss, params)
                row.append((out.detach(), loss.detach()))
            results.append(row)
        _set_grads(params, grads, k, r)
        opt.step()
    return results


def _set_grads(params, grads, k: int, r: int) -> None:
    """Each replica's running mean over its micro-batches, then the mean over replicas."""
    per_replica = []
    for i in range(r):
        mean = grads[0][i]
        for j in range(1, k):  # addons' mean accumulation: a * j/(j+1) + g / (j+1)
            mean = [a * (j / (j + 1)) + g / (j + 1) for a, g in zip(mean, grads[j][i])]
        per_replica.append(mean)
    for p, *gs in zip(params, *per_replica):
        total = gs[0]
        for g in gs[1:]:
            total = total + g
        p.grad = total / r


def _ipu(model, n: int, k: int, r: int, mode: str, period: int = 1):
    opts = poptorch.Options().deviceIterations(n).replicationFactor(r)
    opts.outputMode(getattr(poptorch.OutputMode, mode), period)
    opts.Training.gradientAccumulation(k)
    return poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.1))


def _expected(results, mode: str, period: int):
    """PopTorch's return for each output mode, from the eager ``[micro-batch][replica]``."""
    if mode == "Final":
        picked = results[-1:]
    elif mode == "EveryN":
        picked = results[period - 1 :: period]
    else:
        picked = results
    outs = [o for row in picked for o, _ in row]
    losses = torch.stack([lo for row in picked for _, lo in row])
    if mode == "Sum":
        out = torch.stack([torch.cat([o for o, _ in row]) for row in results]).sum(0)
        loss = torch.stack([torch.stack([lo for _, lo in row]) for row in results]).sum(0)
        return out, loss.reshape(()) if loss.numel() == 1 else loss
    return torch.cat(outs), losses.reshape(()) if losses.numel() == 1 else losses


CASES = [  # (device iterations, gradient accumulation, replicas, output mode)
    (1, 2, 1, "Final"),
    (1, 2, 1, "All"),
    (2, 2, 1, "All"),
    (2, 2, 1, "Final"),
    (2, 2, 1, "Sum"),
    (2, 2, 1, "EveryN"),
    (1, 1, 2, "Final"),
    (2, 1, 2, "All"),
    (1, 2, 2, "All"),
    (2, 2, 2, "Final"),
]


@pytest.mark.parametrize("n,k,r,mode", CASES)
def test_outputs_per_micro_batch_and_replica_match_eager(n, k, r, mode):
    torch.manual_seed(0)
    model = Net()
    twin = copy.deepcopy(model)
    ipu = _ipu(model, n, k, r, mode, 2)
    x, t = _data(4 * n * k * r)
    for call in range(2):  # the second call runs on the first's trained weights
        xs, ts = x + call, t
        out, loss = ipu(xs, ts)
        want_out, want_loss = _expected(_eager_steps(twin, xs, ts, n, k, r), mode, 2)
        assert out.shape == want_out.shape and loss.shape == want_loss.shape
        assert torch.equal(out, want_out) and torch.equal(loss, want_loss)
        assert torch.equal(model.fc.weight, twin.fc.weight)
        assert torch.equal(model.fc.bias, twin.fc.bias)


def test_replicated_accumulation_is_popxl_fx():
    """The same step through popxl_fx.training_model (its rows per replica, then per
    micro-batch): the same weights, and its loss (each replica's mean over its micro-batches,
    then the mean over replicas) from the micro-batch losses PopTorch returns."""
    k, r = 2, 2
    torch.manual_seed(0)
    model = Net()
    twin = LossOnly()  # popxl_fx trains a model returning its loss
    twin.load_state_dict(model.state_dict())
    fx = popxl_fx.training_model(
        twin,
        torch.optim.SGD(twin.parameters(), lr=0.1),
        options=popxl_fx.Options(gradient_accumulation=k, replication_factor=r),
    )
    ipu = _ipu(model, 1, k, r, "All")
    x, t = _data(4 * k * r)
    for _ in range(2):
        out, loss = ipu(x, t)
        # PopTorch's rows [k, R, m] are popxl_fx's [R, k, m]
        want = fx(*(v.reshape(k, r, 4, *v.shape[1:]).transpose(0, 1).flatten(0, 2) for v in (x, t)))
        per_replica = (loss.reshape(k, r)[0] + loss.reshape(k, r)[1]) / k
        assert loss.shape == (k * r,) and out.shape == (4 * k * r, 3)
        assert torch.equal(per_replica.mean(), want)
        assert torch.equal(model.fc.weight, twin.fc.weight)
        assert torch.equal(model.fc.bias, twin.fc.bias)


class WithMetric(Net):
    def forward(self, x):
        out = self.fc(x)
        return out, out.mean()


@pytest.mark.parametrize("n,mode", [(1, "All"), (2, "All"), (2, "Final")])
def test_replicated_inference_returns_each_replicas_scalar(n, mode):
    """A scalar output of an inferenceModel with 2 replicas: one per replica (PopTorch's
    ``[R]`` per iteration), not their mean; batched outputs in the call's row order."""
    torch.manual_seed(0)
    model = WithMetric()
    opts = poptorch.Options().deviceIterations(n).replicationFactor(2)
    opts.outputMode(getattr(poptorch.OutputMode, mode))
    x, _ = _data(4 * n * 2)
    out, metric = poptorch.inferenceModel(model, opts)(x)
    chunks = [model(c) for c in x.chunk(n * 2)]
    picked = chunks[-2:] if mode == "Final" else chunks
    assert torch.equal(out, torch.cat([o for o, _ in picked]).detach())
    assert torch.equal(metric, torch.stack([m for _, m in picked]).detach())
