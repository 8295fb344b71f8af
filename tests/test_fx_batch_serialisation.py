"""``Options(batch_serialisation=k)`` against the plain program on the simulator (same data,
initial weights and batch), and a BatchNorm CNN against eager PyTorch slicing by hand.

Tolerances: slicing re-orders reductions over the batch (the weight gradients' sums over
samples, the loss's mean, the mean-accumulation over slices) and torch's CPU matmul picks its
kernel by the number of rows, so results agree to float32 round-off, not bitwise. The bounds
below are a few times the measured worst differences (stated beside each).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import popxl_fx

from .fx_train_util import max_diff, train_eager, train_fx
from .fx_zoo import GPT, SeedMLP, small_cnn


def _sgd(ps):
    return torch.optim.SGD(ps, lr=0.05, momentum=0.9)


def _mlp_batches(n: int, batch: int = 16):
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(batch, 1, 28, 28, generator=g), torch.randint(0, 10, (batch,), generator=g))
        for _ in range(n)
    ]


def _gpt_batches(n: int, batch: int = 4):
    g = torch.Generator().manual_seed(2)
    return [
        (
            torch.randint(0, 64, (batch, 16), generator=g),
            torch.randint(0, 64, (batch, 16), generator=g),
        )
        for _ in range(n)
    ]


@pytest.mark.parametrize("k", [2, 4])
def test_seed_mlp_equals_the_plain_program(k):
    torch.manual_seed(0)
    model, batches = SeedMLP(), _mlp_batches(3)
    plain_losses, plain, _ = train_fx(model, batches, F.cross_entropy, _sgd)
    losses, state, _ = train_fx(model, batches, F.cross_entropy, _sgd, batch_serialisation=k)
    # measured worst (k=2 and 4): losses 4.8e-7, parameters 7.5e-9 (weights O(0.05))
    assert max_diff(losses, plain_losses) <= 1e-6
    assert max_diff(state, plain) <= 5e-8
    assert max_diff(state, model.state_dict()) > 1e-3  # the weights did change


def test_gpt_decoder_equals_the_plain_program():
    torch.manual_seed(0)
    model, batches = GPT(), _gpt_batches(3)
    # SGD: Adam divides by sqrt(v) and so blows up round-off where a gradient is zero in
    # exact arithmetic (the attention keys' bias: softmax ignores a per-query constant); with
    # Adam those biases differ by 5e-5 after 3 steps, everything else by round-off
    plain_losses, plain, _ = train_fx(model, batches, None, _sgd)
    losses, state, _ = train_fx(model, batches, None, _sgd, batch_serialisation=2)
    # measured worst: losses 0, parameters 1.5e-8
    assert max_diff(losses, plain_losses) <= 1e-6
    assert max_diff(state, plain) <= 1e-7
    assert max_diff(state, model.state_dict()) > 1e-4


@pytest.mark.parametrize(
    ("name", "accumulation", "slices"), [("mlp", 2, 4), ("mlp", 4, 2), ("gpt", 2, 2)]
)
def test_with_gradient_accumulation_equals_the_plain_program(name, accumulation, slices):
    """Each of the micro-batches in slices: the gradients are the mean over all of them."""
    torch.manual_seed(0)
    if name == "mlp":
        model, batches, loss_fn = SeedMLP(), _mlp_batches(3), F.cross_entropy
    else:
        model, batches, loss_fn = GPT(), _gpt_batches(3), None
    plain_losses, plain, _ = train_fx(model, batches, loss_fn, _sgd)
    losses, state, trainer = train_fx(
        model,
        batches,
        loss_fn,
        _sgd,
        gradient_accumulation=accumulation,
        batch_serialisation=slices,
    )
    # measured worst: losses 4.8e-7 (each), parameters 7.5e-9 (mlp) / 1.5e-8 (gpt)
    assert max_diff(losses, plain_losses) <= 1e-6
    assert max_diff(state, plain) <= 1e-7
    stages = [s.name for s in trainer._active.stages]
    assert stages.index("accumulation") < stages.index("batch_serialisation")


def test_with_device_iterations_equals_the_steps_one_call_each():
    torch.manual_seed(0)
    model, batches = SeedMLP(), _mlp_batches(4)
    opts = {"gradient_accumulation": 2, "batch_serialisation": 2}
    losses, state, _ = train_fx(model, batches, F.cross_entropy, _sgd, **opts)
    stacked = [tuple(torch.stack(parts) for parts in zip(*batches[i : i + 2])) for i in (0, 2)]
    per_call, state_n, _ = train_fx(
        model, stacked, F.cross_entropy, _sgd, device_iterations=2, **opts
    )
    # the same programs' arithmetic, looped: bit for bit
    assert torch.equal(torch.cat(per_call), torch.stack(losses))
    assert all(torch.equal(state[k], state_n[k]) for k in state)


def _bn_batches(n: int, batch: int = 8):
    g = torch.Generator().manual_seed(3)
    return [
        (torch.randn(batch, 1, 28, 28, generator=g), torch.randint(0, 10, (batch,), generator=g))
        for _ in range(n)
    ]


def _sliced_by_hand(k: int):
    """Eager PyTorch doing batch serialisation by hand: k forward/backward passes on the
    slices (BatchNorm statistics per slice, running statistics updated k times), gradients
    averaged over the slices, one optimizer step (by the caller)."""

    def step(model, batch):
        x, y = batch
        losses = []
        for xs, ys in zip(x.chunk(k), y.chunk(k)):
            loss = F.cross_entropy(model(xs), ys)
            (loss / k).backward()
            losses.append(loss.detach())
        return torch.stack(losses).mean()

    return step


@pytest.mark.parametrize(
    "split",
    [{"batch_serialisation": 4}, {"gradient_accumulation": 2, "batch_serialisation": 2}],
    ids=["slices", "micro_batches_of_slices"],
)
def test_batchnorm_statistics_are_per_slice_like_eager_slicing_by_hand(split):
    """Micro-batches of slices are consecutive quarters of the batch: the same as 4 slices."""
    torch.manual_seed(0)
    model, batches, k = small_cnn(), _bn_batches(3), 4
    ref_losses, ref = train_eager(model, batches, _sgd, _sliced_by_hand(k))
    losses, state, _ = train_fx(model, batches, F.cross_entropy, _sgd, **split)
    # measured worst (both splits): losses 2.4e-7, parameters 3.0e-8, running statistics 4.7e-10
    assert max_diff(losses, ref_losses) <= 1e-6
    assert max_diff(state, ref) <= 1e-7
    assert int(state["1.num_batches_tracked"]) == 3 * k  # one update per slice
    # and it is not the whole batch's statistics: eager on the whole batch differs
    _, whole = train_eager(model, batches, _sgd, _sliced_by_hand(1))
    assert float((whole["1.running_var"] - state["1.running_var"]).abs().max()) > 1e-3


def test_activation_memory_is_lower_than_the_plain_program():
    torch.manual_seed(0)
    model, batches = SeedMLP(), _mlp_batches(1, batch=512)
    *_, plain = train_fx(model, batches, F.cross_entropy, _sgd)
    *_, serial = train_fx(model, batches, F.cross_entropy, _sgd, batch_serialisation=4)
    a, b = (t.report().totals() for t in (plain, serial))
    # measured: activations peak 13.6 MiB -> 6.1 MiB (the 3.6 MiB of weight gradients, made
    # one layer at a time, are in both); variables 7.1 -> 10.7 MiB (the float32 gradient
    # accumulators); 9.1 MiB of activations go to Streaming Memory
    assert b["not_always_live_peak_bytes"] < 0.5 * a["not_always_live_peak_bytes"]
    assert (
        b["variable_bytes"] - a["variable_bytes"]
        == 4 * sum(p.numel() for p in model.parameters()) + 4
    )
    assert b["streaming_memory_bytes"] > 0 == a["streaming_memory_bytes"]


def test_the_forward_and_backward_graphs_run_once_per_slice():
    torch.manual_seed(0)
    model = SeedMLP()
    *_, trainer = train_fx(model, _mlp_batches(1), F.cross_entropy, _sgd, batch_serialisation=4)
    runs = {g.name: g.runs for g in trainer.report().plan.graphs}
    assert runs["main"] == 1
    assert runs[_prog(trainer).forward.graph.name] == 4
    assert runs[_prog(trainer).backward.graph.name] == 4
    assert trainer.report().totals()["remote_bytes_stored"] > 0


def _prog(trainer):
    return trainer._active


def test_a_batch_that_does_not_divide_raises_at_build():
    model = SeedMLP()
    trainer = popxl_fx.training_model(
        model,
        _sgd(model.parameters()),
        F.cross_entropy,
        popxl_fx.Options(device="cpu", batch_serialisation=3),
    )
    with pytest.raises(ValueError, match=r"batch of 16 samples does not divide by 3"):
        trainer(*_mlp_batches(1)[0])


def test_inputs_without_one_batch_dimension_are_refused():
    model = SeedMLP()
    trainer = popxl_fx.training_model(
        model, _sgd(model.parameters()), F.cross_entropy, popxl_fx.Options(batch_serialisation=2)
    )
    x, y = _mlp_batches(1)[0]
    with pytest.raises(ValueError, match=r"one shared leading batch dimension"):
        trainer(x, y[:8])


def test_entry_points_that_do_not_apply_it_refuse_it():
    with pytest.raises(ValueError, match="inference_model refuses it"):
        popxl_fx.inference_model(SeedMLP(), popxl_fx.Options(batch_serialisation=2))
