"""Bad input to the fused optimizer ops (FusedSGD/FusedAdam/FusedAdamW) raises where the op is
built, naming what is wrong. (Their numbers: the op-table samples against torch.optim's fused
step, tests/test_op_table.py; grouping: tests/test_foreach_multi.py.)"""

from __future__ import annotations

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core.ops import var_updates

HYPER = dict(lr=0.1, beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8)


def _tensors(shape=(3, 4), state_shape=None, step_dtype=np.float32):
    p = popxl.variable(np.zeros(shape, np.float32), name="p")
    g = popxl.variable(np.zeros(shape, np.float32), name="g")
    m = popxl.variable(np.zeros(state_shape or shape, np.float32), name="m")
    v = popxl.variable(np.zeros(shape, np.float32), name="v")
    step = popxl.variable(np.array(0, step_dtype), name="step")
    return p, g, m, v, step


def test_state_of_another_shape_raises():
    with popxl.Ir().main_graph:
        p, g, m, v, step = _tensors(state_shape=(4, 3))
        with pytest.raises(
            ValueError, match=r"FusedAdam: exp_avg is float32\(4, 3\), the parameter"
        ):
            var_updates.fused_adam_(p, g, m, v, step, **HYPER)


def test_step_must_be_a_float32_scalar():
    with popxl.Ir().main_graph:
        p, g, m, v, step = _tensors(step_dtype=np.int32)
        with pytest.raises(TypeError, match="step must be a float32 scalar"):
            var_updates.fused_adam_(p, g, m, v, step, **HYPER)


def test_missing_hyper_parameter_raises():
    with popxl.Ir().main_graph:
        p, g, m, v, step = _tensors()
        with pytest.raises(ValueError, match="eps must be given"):
            var_updates.fused_adam_(p, g, m, v, step, **{**HYPER, "eps": None})


def test_packed_and_single_hyper_parameters_together_raise():
    with popxl.Ir().main_graph:
        p, g, m, v, step = _tensors()
        packed = popxl.variable(np.zeros(5, np.float64), popxl.float64, name="hyper")
        with pytest.raises(ValueError, match="give hyper or lr, beta1"):
            var_updates.fused_adam_(p, g, m, v, step, **HYPER, hyper=packed)


def test_packed_hyper_parameters_of_the_wrong_length_raise():
    with popxl.Ir().main_graph:
        p, g, m, v, step = _tensors()
        packed = popxl.variable(np.zeros(4, np.float64), popxl.float64, name="hyper")
        with pytest.raises(ValueError, match=r"hyper must have shape \(5,\) \(values of lr"):
            var_updates.fused_adam_(p, g, m, v, step, hyper=packed)


def test_sgd_momentum_without_a_buffer_raises():
    with popxl.Ir().main_graph:
        p, g, *_ = _tensors()
        with pytest.raises(ValueError, match="momentum 0.9 needs a momentum_buffer"):
            var_updates.fused_sgd_(
                p, g, None, lr=0.1, weight_decay=0.0, momentum=0.9, dampening=0.0, first_step=0.0
            )
