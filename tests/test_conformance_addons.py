"""popxl.addons behaviours Graphcore's addons tests rely on (issue 9)."""

from __future__ import annotations

import numpy as np

import popxl_core as popxl
from addons import GraphCache, Module


class _Scaled(Module):
    """A module whose instances are interchangeable when their configs match."""

    def __init__(self, factor: float):
        super().__init__()
        self.factor = factor

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        return x * self.factor

    def __hash__(self) -> int:
        return hash(self.factor)


def test_graph_cache_keys_modules_on_their_hash():
    ir = popxl.Ir()
    cache = GraphCache()
    with ir.main_graph:
        x = popxl.variable(np.ones(3, np.float32))
        g = cache.create_graph(_Scaled(2.0), x)
        assert cache.create_graph(_Scaled(2.0), x) is g  # another instance, same hash
        assert cache.create_graph(_Scaled(3.0), x) is not g
        # plain functions still match by identity
        f = lambda t: t * 2.0  # noqa: E731
        assert cache.create_graph(f, x) is cache.create_graph(f, x) is not g
