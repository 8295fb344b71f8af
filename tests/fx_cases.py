"""Small helpers to write lowering cases: a module from a function, seeded inputs."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

__all__ = ["Fn", "WithBuffers", "randn", "seq"]


class _Fn(nn.Module):
    def __init__(self, fn: Callable) -> None:
        super().__init__()
        self.fn = fn


class _Fn1(_Fn):
    def forward(self, x):
        return self.fn(x)


class _Fn2(_Fn):
    def forward(self, x, y):
        return self.fn(x, y)


class _Fn3(_Fn):
    def forward(self, x, y, z):
        return self.fn(x, y, z)


def Fn(fn: Callable, arity: int = 1) -> nn.Module:
    """A root module whose forward calls ``fn`` on its ``arity`` inputs (fx traces through a
    root module, so ``fn``'s calls are the nodes being lowered)."""
    return {1: _Fn1, 2: _Fn2, 3: _Fn3}[arity](fn)


class WithBuffers(nn.Module):
    """``forward(x, t) = fn(x, t, **consts)``: constant tensors (class weights, ...) held as
    frozen parameters (requires_grad=False), so they become variables."""

    def __init__(self, fn: Callable, **buffers) -> None:
        super().__init__()
        self.fn = fn
        self.names = sorted(buffers)
        for name in self.names:
            self.register_parameter(name, nn.Parameter(buffers[name], requires_grad=False))

    def forward(self, x, t):
        return self.fn(x, t, **{n: getattr(self, n) for n in self.names})


def seq(*modules: nn.Module) -> nn.Sequential:
    """The modules as leaves (the root itself is always traced through)."""
    return nn.Sequential(*modules)


def randn(*shape: int, seed: int = 0, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g) * scale + shift
