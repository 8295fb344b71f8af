"""``w @ x`` of a matrix (or vector) ``w`` and a batch ``x``, bit for bit with eager (tolerance 0).

at::matmul folds such a product into one ``mm`` over ``x``'s rows when ``w`` requires grad (so
that ``w``'s gradient is one ``mm``, not a batch of them summed) and runs one ``bmm`` of the
expanded ``w`` otherwise; the two round differently on some CPUs. The simulator's operands
never require grad, so it must take eager's flags from the capture (Mamba's
``dt_proj.weight @ time_step.transpose(1, 2)`` on a slice of ``x_proj``'s output, issue 34).
Besides the numbers, the BLAS calls the simulator makes are compared with eager's: equal
numbers on this CPU can hide another kernel that rounds differently on another.
"""

from __future__ import annotations

import collections
import copy

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import popxl_fx
from popxl_fx import Options

_BLAS = {"mm", "bmm", "addmm", "baddbmm", "mv", "addmv", "dot"}


class _BlasCalls(TorchDispatchMode):
    """The BLAS-backed ATen calls made inside, by op, operand shapes and strides."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in _BLAS:
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            self.calls[(name, *((tuple(t.shape), t.stride()) for t in tensors))] += 1
        return func(*args, **(kwargs or {}))


class DtProj(nn.Module):
    """Mamba's time-step projection: a matrix times a transposed slice of a batch."""

    def __init__(self, rank: int = 6, inner: int = 40, frozen: bool = False) -> None:
        super().__init__()
        self.x_proj = nn.Linear(16, rank + 10, bias=False)
        self.dt_proj = nn.Linear(rank, inner)
        self.dt_proj.weight.requires_grad_(not frozen)
        self.rank = rank

    def forward(self, x):
        time_step, _ = torch.split(self.x_proj(x), [self.rank, 10], dim=-1)
        return self.dt_proj.weight @ time_step.transpose(1, 2)


class MatrixTimesBatch(nn.Module):
    """``w @ x`` and ``v @ x`` of parameters and a contiguous batch."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(3)
        self.w = nn.Parameter(torch.randn(24, 48, generator=gen) / 7)
        self.v = nn.Parameter(torch.randn(24, generator=gen))

    def forward(self, x):
        return self.v @ torch.relu(self.w @ x)


def _input(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(1))


def _grads(module: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    x = x.clone().requires_grad_()
    out = module(x)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(5)))
    return [out.detach(), x.grad, *(p.grad for p in module.parameters() if p.grad is not None)]


def _same_as_eager(module: nn.Module, x: torch.Tensor) -> None:
    eager = _grads(copy.deepcopy(module), x)
    sim = _grads(popxl_fx.compile(copy.deepcopy(module), Options(device="cpu")), x)
    assert len(sim) == len(eager)
    for got, want in zip(sim, eager):
        assert torch.equal(got, want), (got - want).abs().max()


def _inference_blas_calls(module: nn.Module, x: torch.Tensor) -> tuple:
    """(eager's BLAS calls, the simulator's) for one forward under no_grad."""
    module.eval()
    sim = popxl_fx.inference_model(copy.deepcopy(module), Options(device="cpu"))
    with torch.no_grad():
        want = module(x)
        sim(x)  # builds the program: the kernels of the second call are the run's alone
        with _BlasCalls() as seen_eager:
            module(x)
        with _BlasCalls() as seen_sim:
            got = sim(x)
    assert torch.equal(got, want), (got - want).abs().max()
    return seen_eager.calls, seen_sim.calls


def test_matrix_times_batch_gradients():
    """The parameter gradients are eager's single mm over the batch's rows (were up to 3.8e-5
    off: one product per batch item, then their sum)."""
    _same_as_eager(MatrixTimesBatch(), _input(8, 48, 100))


def test_dt_proj_forward_and_gradients():
    _same_as_eager(DtProj(), _input(4, 33, 16))


def test_dt_proj_frozen_weight():
    """A weight that needs no gradient: eager batches the product (one bmm), and so must we."""
    _same_as_eager(DtProj(frozen=True), _input(4, 33, 16))


def test_dt_proj_inference_makes_eagers_blas_calls():
    """Under no_grad the weight still requires grad (a flag of the parameter, not of the grad
    mode): eager folds into one mm, where the simulator's plain operands gave a bmm."""
    eager, sim = _inference_blas_calls(DtProj(), _input(4, 33, 16))
    assert [k[0] for k in eager] == ["mm", "mm"]  # x_proj, then the folded dt product
    assert sim == eager


def test_frozen_dt_proj_inference_makes_eagers_blas_calls():
    eager, sim = _inference_blas_calls(DtProj(frozen=True), _input(4, 33, 16))
    assert sorted(k[0] for k in eager) == ["bmm", "mm"]
    assert sim == eager


def test_matrix_times_batch_inference_makes_eagers_blas_calls():
    eager, sim = _inference_blas_calls(MatrixTimesBatch(), _input(8, 48, 100))
    assert sim == eager
