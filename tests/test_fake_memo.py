"""The memo of the Aten ops' fake-tensor shape rules (`popxl_core.ops.fake_memo`): a repeated
call is answered without a fake run, and nothing the answer depends on is left out of the key
(argument types, torch's default dtype, the wrapped operator, eager-layout flags)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import popxl_core as popxl
from popxl_core.ops import aten as aten_mod
from popxl_core.ops.fake_memo import typed
from popxl_fx.lowerings.eager_layout import EagerLayout

ATEN = torch.ops.aten


@pytest.fixture
def fake_runs(monkeypatch):
    """How many times the shape rule ran on fake tensors (the real rule, counted)."""
    runs = []
    real = aten_mod._fake_specs

    def counted(*args):
        runs.append(args[1])
        return real(*args)

    monkeypatch.setattr(aten_mod, "_fake_specs", counted)
    return runs


def _ints():
    return popxl.variable(np.arange(6, dtype=np.int32).reshape(2, 3), popxl.int32)


def test_a_repeated_call_is_answered_without_a_fake_run(fake_runs):
    ir = popxl.Ir()
    with ir.main_graph:
        x = _ints()
        shape = (aten_mod.Slot(0), [3, 2])
        first = popxl.ops.aten_op(ATEN.reshape.default, [x], shape)[0]
        second = popxl.ops.aten_op(ATEN.reshape.default, [x], shape)[0]
    assert first.shape == second.shape == (3, 2)
    assert len([f for f in fake_runs if getattr(f, "op", None) is ATEN.reshape.default]) <= 1


def test_an_int_and_a_float_scalar_are_two_keys():
    """``1 == 1.0`` in Python, but int32 * 2 is int32 and int32 * 2.0 is float32."""
    ir = popxl.Ir()
    with ir.main_graph:
        x = _ints()
        by_int = popxl.ops.aten_op(ATEN.mul.Scalar, [x], (aten_mod.Slot(0), 2))[0]
        by_float = popxl.ops.aten_op(ATEN.mul.Scalar, [x], (aten_mod.Slot(0), 2.0))[0]
        by_bool = popxl.ops.aten_op(ATEN.mul.Scalar, [x], (aten_mod.Slot(0), True))[0]
    assert (by_int.dtype, by_float.dtype, by_bool.dtype) == (
        popxl.int32,
        popxl.float32,
        popxl.int32,
    )


def test_the_default_dtype_is_part_of_the_key():
    """A Python float becomes a tensor of torch's default dtype."""
    before = torch.get_default_dtype()
    ir = popxl.Ir()
    with ir.main_graph:
        as_float = popxl.ops.aten_op(ATEN.scalar_tensor.default, [], (1.5,))[0]
        torch.set_default_dtype(torch.float64)
        try:
            as_double = popxl.ops.aten_op(ATEN.scalar_tensor.default, [], (1.5,))[0]
        finally:
            torch.set_default_dtype(before)
    assert (as_float.dtype, as_double.dtype) == (popxl.float32, popxl.float64)


def test_typed_tells_apart_what_equality_does_not():
    keys = [typed(v) for v in (1, 1.0, True, 0.0, -0.0, (1,), (1.0,))]
    assert len(set(keys)) == len(keys)
    assert typed(float("nan")) == typed(float("nan"))
    assert typed(aten_mod.Slot(1)) != typed(aten_mod.Slot(True))
    assert typed(torch.ones(1)) is None and typed((1, torch.ones(1))) is None
    assert typed([1, 2]) is None  # a list could change under the key


def test_only_operators_fixed_by_the_torch_build_are_keyed():
    def mine(x):
        return x

    lib = torch.library.Library("fake_memo_test", "FRAGMENT")
    lib.define("twice(Tensor x) -> Tensor")
    assert aten_mod.fake_key(ATEN.cat.default) is not None
    assert aten_mod.fake_key(torch.matmul) is not None
    assert aten_mod.fake_key(torch.nn.functional.silu) is not None
    assert aten_mod.fake_key(torch.ops.fake_memo_test.twice.default) is None
    assert aten_mod.fake_key(mine) is None
    assert aten_mod.fake_key(aten_mod.Call(mine, (aten_mod.Slot(0),), ())) is None


def test_eager_layouts_key_their_operator_layouts_and_flags():
    plain = EagerLayout(torch.matmul, ((1, 2), None))
    keys = {
        aten_mod.fake_key(plain),
        aten_mod.fake_key(EagerLayout(torch.matmul, ((1, 2), None), (True, False))),
        aten_mod.fake_key(EagerLayout(torch.matmul, ((2, 1), None))),
        aten_mod.fake_key(EagerLayout(torch.bmm, ((1, 2), None))),
    }
    assert None not in keys and len(keys) == 4
    assert aten_mod.fake_key(EagerLayout(lambda a, b: a @ b, (None, None))) is None


def test_a_torch_function_mode_turns_the_memo_off(fake_runs):
    class Mode(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    ir = popxl.Ir()
    with ir.main_graph:
        x = _ints()
        popxl.ops.aten_op(ATEN.neg.default, [x], (aten_mod.Slot(0),))
        with Mode():
            popxl.ops.aten_op(ATEN.neg.default, [x], (aten_mod.Slot(0),))
            popxl.ops.aten_op(ATEN.neg.default, [x], (aten_mod.Slot(0),))
    assert len([f for f in fake_runs if getattr(f, "op", None) is ATEN.neg.default]) >= 2
