"""`AdamOptimizerStep`: one AdamW update of a variable, with its state as named inputs."""

import math
from functools import partial

import numpy as np

import popxl_core
from popxl_core import Tensor, TensorByRef, dtype, float16, float32, ops

from ..module import Module

__all__ = ["AdamOptimizerStep"]

Value = float | Tensor


def _as_float32(v: Value) -> Value:
    return ops.cast(v, float32) if isinstance(v, Tensor) and v.dtype is not float32 else v


def _grad_scale(
    loss_scaling: Value, global_norm: Tensor | None, global_norm_max: Value | None
) -> Value:
    """The factor that turns the incoming gradient into the one Adam uses: undo the loss
    scaling, then clip so that the global norm of the true gradients is at most the max."""
    scale: Value = (
        1.0 / loss_scaling
        if not isinstance(loss_scaling, Tensor)
        else (1.0 / _as_float32(loss_scaling))
    )
    if global_norm is None:
        return scale
    assert global_norm_max is not None  # `build` refuses a global_norm without it
    true_norm = _as_float32(global_norm) * scale
    norm_max = _as_float32(global_norm_max)
    # min(1, max / norm) without dividing by a zero norm
    return scale * (norm_max / ops.maximum(true_norm, norm_max))


def _is_one(v: Value) -> bool:
    return not isinstance(v, Tensor) and float(v) == 1.0


def _zero_state(
    module: Module, var: Tensor, replica_grouping, name: str, dt: dtype, shape=None
) -> Tensor:
    """A zero-initialised state input of ``module`` by reference (the var's shape unless
    ``shape``). For a replica-sharded ``var`` (a spec with a ``meta_shape``) the state is
    sharded the same way, as popxl.addons' Adam: its factory makes the whole tensor."""
    var_shape = var.shape
    if var.meta_shape and shape is None:
        shard_over = math.prod(var.meta_shape) // math.prod(var.shape)
        return module.add_replica_sharded_variable_input(
            name,
            partial(np.zeros, var.meta_shape),
            dt,
            by_ref=True,
            replica_grouping=replica_grouping,
            shard_over=shard_over,
        )
    return module.add_variable_input(
        name,
        partial(np.zeros, var_shape if shape is None else shape),
        dt,
        by_ref=True,
        replica_grouping=replica_grouping,
    )


class AdamOptimizerStep(Module):
    """AdamW on ``var`` in place (decoupled weight decay, optional bias correction).

    Named inputs (all by reference, zero-initialised): ``first_order`` (dtype
    ``first_order_dtype``), ``second_order`` (float32) and, with ``bias_correction``,
    ``step`` (a float32 scalar that the update increments).

    ``grad`` is the gradient multiplied by ``loss_scaling``. With ``global_norm`` (the L2
    norm of all the loss-scaled gradients, a scalar Tensor) and ``global_norm_max``, the true
    gradient is clipped by ``min(1, global_norm_max / true global norm)``.
    """

    @popxl_core.in_sequence()
    def build(
        self,
        var: TensorByRef,  # type: ignore[valid-type]  # PopXL's marker, read by create_graph
        grad: Tensor,
        replica_grouping=None,
        *,
        lr: Value,
        beta1: Value = 0.9,
        beta2: Value = 0.999,
        eps: Value = 1e-5,
        weight_decay: Value = 1e-2,
        first_order_dtype: dtype = float16,
        bias_correction: bool = True,
        loss_scaling: Value = 1,
        global_norm: Tensor | None = None,
        global_norm_max: Value | None = None,
    ) -> None:
        if global_norm is not None and global_norm_max is None:
            raise ValueError("AdamOptimizerStep: global_norm was given without global_norm_max.")
        if global_norm is not None or not _is_one(loss_scaling):
            scale = _grad_scale(loss_scaling, global_norm, global_norm_max)
            grad = grad * (ops.cast(scale, grad.dtype) if isinstance(scale, Tensor) else scale)
        state = partial(_zero_state, self, var, replica_grouping)
        first_order = state("first_order", first_order_dtype)
        ops.var_updates.accumulate_moving_average_(first_order, grad, f=beta1)
        second_order = state("second_order", float32)
        ops.var_updates.accumulate_moving_average_square_(second_order, grad, f=beta2)
        step = state("step", float32, ()) if bias_correction else None
        update = ops.var_updates.adam_updater(
            first_order,
            second_order,
            weight=var,
            time_step=step,
            weight_decay=weight_decay,
            beta1=beta1,
            beta2=beta2,
            epsilon=eps,
        )
        ops.scaled_add_(var, update, b=-lr)
