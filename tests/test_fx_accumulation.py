"""popxl_fx Options(gradient_accumulation=k, device_iterations=n) against the plain program.

- gradient_accumulation: the batch is cut into k consecutive micro-batches; their gradients
  are mean-accumulated and the optimizer steps once. Against the plain program on the same
  global batch the arithmetic differs only in the order of the batch reduction (k partial
  means, then their running mean), so losses and parameters agree to float32 round-off:
  the bounds below are a few float32 ulps of the values compared (worst measured differences
  are in the comments).
- Batch norm's statistics are per micro-batch (as in PopTorch), so a CNN with batch norm is
  checked against eager PyTorch doing the same split by hand, running statistics included.
- device_iterations: one call running n steps is bit for bit n calls of the plain program.
"""

from __future__ import annotations

import pytest
import torch

import popxl_fx
from tests.fx_zoo import OPTIMIZERS, ZOO


def _trainer(case, optimizer: str, **options):
    opt = OPTIMIZERS[optimizer](case.model.parameters())
    opts = popxl_fx.Options(device="cpu", **options)
    return popxl_fx.training_model(case.model, opt, case.loss_fn, opts), opt


def _args(case) -> tuple:
    return (*case.inputs, case.targets) if case.targets is not None else case.inputs


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _train(name: str, optimizer: str, steps: int, **options):
    case = ZOO[name]()
    trainer, _ = _trainer(case, optimizer, **options)
    losses = torch.stack([trainer(*_args(case)) for _ in range(steps)])
    return losses, _state(trainer.model)


def _worst(a: dict, b: dict) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


# name, optimizer, k, bound on |loss diff|, bound on |param diff|, after 3 steps.
# Losses are ~2.3 (MLP) and ~4.2 (GPT): 1e-6 is 2-4 float32 ulps. SGD moves parameters by
# lr * gradient, so gradient round-off stays round-off (2e-8: a few ulps of the weights).
# Adam divides by the gradient's running RMS: a parameter whose gradient is near round-off
# level moves by up to ~lr on round-off alone, so its bound is 1% of lr=1e-3.
# Measured worst (loss / params): MLP SGD k=2 0 / 3.7e-9; MLP AdamW k=4 0 / 1.3e-6;
# GPT AdamW k=2 4.8e-7 / 7.0e-7.
ACCUMULATION = [
    ("seed_mlp", "sgd_momentum", 2, 1e-6, 2e-8),
    ("seed_mlp", "adamw", 4, 1e-6, 1e-5),
    ("gpt", "adamw", 2, 1e-6, 1e-5),
]


@pytest.mark.parametrize("name,optimizer,k,loss_bound,param_bound", ACCUMULATION)
def test_accumulation_equals_the_plain_program(name, optimizer, k, loss_bound, param_bound):
    plain_losses, plain = _train(name, optimizer, 3)
    losses, params = _train(name, optimizer, 3, gradient_accumulation=k)
    loss_diff = float((losses - plain_losses).abs().max())
    param_diff = _worst(params, plain)
    print(f"{name} k={k}: loss diff {loss_diff:.3g}, param diff {param_diff:.3g}")
    assert loss_diff <= loss_bound and param_diff <= param_bound


def _eager_accumulated(case, optimizer: str, k: int, steps: int):
    """Eager PyTorch doing the split by hand: k micro-batches per step, each loss/k
    backpropagated (the gradients sum to the mean of the micro-batch gradients), one step."""
    opt = OPTIMIZERS[optimizer](case.model.parameters())
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        total = torch.zeros(())
        for x, y in zip(case.inputs[0].chunk(k), case.targets.chunk(k)):
            loss = case.loss_fn(case.model(x), y)
            (loss / k).backward()
            total = total + loss.detach()
        opt.step()
        losses.append(total / k)
    return torch.stack(losses), _state(case.model)


def test_batch_norm_cnn_against_eager_split_by_hand():
    """Batch-norm statistics per micro-batch, running statistics updated once per
    micro-batch, as eager torch does when it runs the micro-batches one after the other.
    Measured: bit for bit (loss, parameters and buffers) for k=2, where halving is exact; the
    bound is 1e-7 (a few ulps of values of order 1) since eager's summed loss/k gradients
    and the simulator's running mean of the gradients may round differently in general."""
    k, steps = 2, 3
    sim_losses, sim = _train("small_cnn", "sgd_momentum", steps, gradient_accumulation=k)
    eager_losses, eager = _eager_accumulated(ZOO["small_cnn"](), "sgd_momentum", k, steps)
    assert "1.running_mean" in sim and "1.num_batches_tracked" in sim
    assert int(sim["1.num_batches_tracked"]) == k * steps
    loss_diff = float((sim_losses - eager_losses).abs().max())
    diff = _worst(sim, eager)
    print(f"small_cnn k={k}: loss diff {loss_diff:.3g}, param/buffer diff {diff:.3g}")
    assert loss_diff <= 1e-6 and diff <= 1e-7


def _batches(case, n: int, call: int) -> list[tuple]:
    """n different batches (the case's, perturbed: noise on float inputs, tokens rolled),
    the same for both runs."""
    out = []
    for i in range(n):
        g = torch.Generator().manual_seed(100 * call + i)
        step = []
        for x in _args(case):
            if x.is_floating_point():
                step.append(x + 0.1 * torch.randn(x.shape, generator=g))
            else:
                step.append(torch.roll(x, shifts=n * call + i, dims=-1))
        out.append(tuple(step))
    return out


@pytest.mark.parametrize(
    "name,optimizer", [("seed_mlp", "sgd_momentum"), ("seed_mlp", "adamw"), ("gpt", "adamw")]
)
def test_device_iterations_are_n_plain_steps_bit_for_bit(name, optimizer):
    """SGD's first step and Adam's bias corrections differ per step: fed per step."""
    n, calls = 3, 2
    case = ZOO[name]()
    plain, _ = _trainer(case, optimizer)
    plain_losses = [plain(*b) for c in range(calls) for b in _batches(case, n, c)]
    case2 = ZOO[name]()
    looped, _ = _trainer(case2, optimizer, device_iterations=n)
    losses = []
    for c in range(calls):
        stacked = [torch.stack(parts) for parts in zip(*_batches(case2, n, c))]
        out = looped(*stacked)
        assert out.shape == (n,)
        losses.extend(out)
    assert torch.equal(torch.stack(losses), torch.stack(plain_losses))
    a, b = _state(plain.model), _state(looped.model)
    assert all(torch.equal(a[key], b[key]) for key in a)
    sa, sb = plain.optimizer.state_dict()["state"], looped.optimizer.state_dict()["state"]
    assert all(torch.equal(sa[i][key], sb[i][key]) for i in sa for key in sa[i])


def test_device_iterations_with_accumulation_equal_n_accumulated_steps():
    n, k = 2, 4
    case = ZOO["seed_mlp"]()
    acc, _ = _trainer(case, "sgd_momentum", gradient_accumulation=k)
    plain_losses = [acc(*_args(case)) for _ in range(n)]
    case2 = ZOO["seed_mlp"]()
    both, _ = _trainer(case2, "sgd_momentum", gradient_accumulation=k, device_iterations=n)
    losses = both(*[torch.stack([t] * n) for t in _args(case2)])
    assert torch.equal(losses, torch.stack(plain_losses))
    a, b = _state(acc.model), _state(both.model)
    assert all(torch.equal(a[key], b[key]) for key in a)


def test_lr_scheduler_applies_per_call_with_device_iterations():
    """Hyper-parameters are read from the torch optimizer once per call: a scheduler
    stepped after each call changes the lr of the next call's n steps (as in PopTorch)."""
    n = 2
    results = []
    for iterations in (1, n):
        case = ZOO["seed_mlp"]()
        trainer, opt = _trainer(case, "sgd_momentum", device_iterations=iterations)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        for _ in range(2):
            if iterations == 1:
                for _ in range(n):  # the plain program: lr changes after every n steps too
                    trainer(*_args(case))
            else:
                trainer(*[torch.stack([t] * n) for t in _args(case)])
            sched.step()
        results.append(_state(trainer.model))
    assert all(torch.equal(results[0][k], results[1][k]) for k in results[0])


@pytest.mark.parametrize(
    "options,shape,words",
    [
        ({"gradient_accumulation": 3}, (8, 1, 28, 28), ["gradient_accumulation=3", "8", "3"]),
        ({"device_iterations": 2}, (8, 1, 28, 28), ["device_iterations=2", "(8, 1, 28, 28)"]),
        (
            {"device_iterations": 2, "gradient_accumulation": 3},
            (2, 8, 1, 28, 28),
            ["gradient_accumulation=3", "batch size 8"],
        ),
    ],
)
def test_sizes_that_do_not_divide_raise_at_build(options, shape, words):
    case = ZOO["seed_mlp"]()
    trainer, _ = _trainer(case, "sgd_momentum", **options)
    lead = shape[:-4]
    y = torch.zeros((*lead, shape[-4]), dtype=torch.long)
    with pytest.raises(ValueError) as err:
        trainer(torch.randn(shape), y)
    assert all(w in str(err.value) for w in words), str(err.value)
