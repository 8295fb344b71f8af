"""popxl_fx.poptorch: a call of another structure than the compiled one is bound to
forward's signature as PopTorch binds it and raises PopTorch's error, input by input."""

from __future__ import annotations

import pytest
import torch

import popxl_fx.poptorch as poptorch


class _Model(torch.nn.Module):
    def forward(self, a, *c, z=None, u=3, **w):
        r = a * u + sum(c) + sum(w.values())
        return r if z is None else r + z


def _compiled():
    model = _Model()
    ipu = poptorch.inferenceModel(model)
    a, c, z, m = (torch.full((2,), float(i)) for i in range(1, 5))
    assert torch.equal(ipu(a, c, z=z, m=m), model(a, c, z=z, m=m))
    return ipu, (a, c, z, m)


def test_an_optional_tensor_left_out_is_a_type_mismatch():
    ipu, (a, c, z, m) = _compiled()
    with pytest.raises(poptorch.Error, match="Type mismatch for z: expected .*Tensor.* got .*None"):
        ipu(a, c, m=m)


def test_a_kwargs_entry_left_out_is_missing():
    ipu, (a, c, z, m) = _compiled()
    with pytest.raises(poptorch.Error, match="Keys mismatch for named arguments: Missing .*: m."):
        ipu(a, c, z=z)


def test_another_constant_is_a_value_mismatch():
    ipu, (a, c, z, m) = _compiled()
    with pytest.raises(poptorch.Error, match="Value mismatch for u: expected 3 but got 5"):
        ipu(a, c, z=z, u=5, m=m)


def test_fewer_positionals_is_a_count_mismatch():
    ipu, (a, c, z, m) = _compiled()
    with pytest.raises(poptorch.Error, match="expected 2 arguments but got 1"):
        ipu(a, z=z, m=m)
