"""nn and random ops reject bad arguments with clear errors, before changing the graph."""

from __future__ import annotations

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core import ops
from popxl_core.random_seed import create_seeds


@pytest.fixture
def main():
    ir = popxl.Ir()
    with ir.main_graph:
        yield ir.main_graph


def _var(*shape, dtype=np.float32):
    return popxl.variable(np.zeros(shape, dtype))


def _raises(exc, match, fn, graph):
    n_ops = len(graph._ops)
    with pytest.raises(exc, match=match) as info:
        fn()
    assert len(graph._ops) == n_ops, "a failed op must leave the graph unchanged"
    return str(info.value)


# conv -------------------------------------------------------------------------------------
def test_conv_channel_mismatch(main):
    x, w = _var(1, 3, 5, 5), _var(4, 2, 3, 3)
    msg = _raises(ValueError, "channel mismatch", lambda: ops.conv(x, w), main)
    assert "3 channels" in msg and "expects 2" in msg
    assert "test_ops_nn_errors.py" in msg  # points at the user's line


def test_conv_groups_must_divide_output_channels(main):
    x, w = _var(1, 4, 5, 5), _var(3, 2, 3, 3)
    _raises(ValueError, "groups=2", lambda: ops.conv(x, w, groups=2), main)


def test_conv_rank_and_argument_lengths(main):
    x, w = _var(1, 3, 5, 5), _var(4, 3, 3, 3)
    _raises(ValueError, "padding", lambda: ops.conv(x, w, padding=(1, 2, 3)), main)
    _raises(ValueError, "spatial", lambda: ops.conv(_var(3, 5), _var(2, 3), stride=(1,)), main)
    _raises(ValueError, "rank", lambda: ops.conv(x, _var(4, 3, 3)), main)
    _raises(ValueError, "pad type", lambda: ops.conv(x, w, pad_type="same"), main)
    _raises(ValueError, ">= 0", lambda: ops.conv(x, w, padding=(-1, 0, 0, 0)), main)


def test_conv_kernel_larger_than_input(main):
    x, w = _var(1, 3, 2, 2), _var(4, 3, 3, 3)
    _raises(ValueError, "smaller than the dilated kernel", lambda: ops.conv(x, w), main)


def test_conv_dtype_mismatch(main):
    x, w = _var(1, 3, 5, 5), _var(4, 3, 3, 3, dtype=np.float16)
    _raises(TypeError, "same dtype", lambda: ops.conv(x, w), main)


def test_conv_transpose_channel_mismatch(main):
    x, w = _var(1, 3, 4, 4), _var(4, 2, 3, 3)
    _raises(ValueError, "channel mismatch", lambda: ops.conv_transpose(x, w), main)


# normalisation ----------------------------------------------------------------------------
def test_group_norm_groups_must_divide_channels(main):
    x, w, b = _var(2, 6, 4), _var(6), _var(6)
    _raises(
        ValueError,
        "num_groups=4 does not divide the 6 channels",
        lambda: ops.group_norm(x, w, b, 4),
        main,
    )


def test_group_norm_weight_shape(main):
    x = _var(2, 6, 4)
    _raises(
        ValueError,
        r"weight must have shape \(6,\)",
        lambda: ops.group_norm(x, _var(4), _var(6), 2),
        main,
    )
    _raises(
        ValueError,
        r"bias must have shape \(6,\)",
        lambda: ops.group_norm(x, _var(6), _var(6, 1), 2),
        main,
    )


def test_layer_norm_last_axis_weight_suggests_reshape(main):
    x = _var(2, 3, 8)
    _raises(ValueError, r"reshape\(\(-1, 8\)\)", lambda: ops.layer_norm(x, _var(8), _var(8)), main)


def test_batch_norm_parameter_shapes(main):
    x = _var(2, 3, 4, 4)
    _raises(
        ValueError,
        "var must have shape",
        lambda: ops.batch_norm_inference(x, _var(3), _var(3), _var(3), _var(4)),
        main,
    )


# pooling ----------------------------------------------------------------------------------
def test_pool_errors(main):
    x = _var(1, 2, 4, 4)
    _raises(ValueError, "does not fit", lambda: ops.max_pool(x, (5, 5)), main)
    _raises(ValueError, "kernel_size", lambda: ops.max_pool(x, (2, 2, 2)), main)
    _raises(ValueError, "dilation", lambda: ops.average_pool(x, (2, 2), dilation=(2, 2)), main)
    _raises(ValueError, "in_dilations", lambda: ops.max_pool(x, (2, 2), in_dilations=(2, 2)), main)
    _raises(
        ValueError,
        "pads must be smaller",
        lambda: ops.max_pool(x, (2, 2), padding=(2, 0, 0, 0)),
        main,
    )


# random -----------------------------------------------------------------------------------
def test_dropout_seed_of_wrong_dtype(main):
    x = _var(3, 4)
    seed = popxl.variable(create_seeds(1).astype(np.int32), popxl.int32)
    _raises(
        TypeError, "seed tensor must be uint32, got int32", lambda: ops.dropout(x, seed, 0.5), main
    )


def test_dropout_seed_of_wrong_shape(main):
    x = _var(3, 4)
    seed = popxl.variable(np.zeros(3, np.uint32), popxl.uint32)
    _raises(ValueError, r"shape \(2,\), got \(3,\)", lambda: ops.dropout(x, seed, 0.5), main)


def test_dropout_probability_range(main):
    x, seed = _var(3, 4), popxl.variable(create_seeds(1), popxl.uint32)
    _raises(ValueError, r"\[0, 1\)", lambda: ops.dropout(x, seed, 1.0), main)
    _raises(ValueError, r"\[0, 1\)", lambda: ops.dropout(x, seed, -0.1), main)
    _raises(
        ValueError, "does not broadcast", lambda: ops.shaped_dropout(x, seed, [2, 4], 0.5), main
    )


def test_random_ops_check_seed_and_dtype(main):
    bad_seed = popxl.variable(np.zeros(2, np.int32), popxl.int32)
    seed = popxl.variable(create_seeds(1), popxl.uint32)
    _raises(TypeError, "uint32", lambda: ops.random_uniform(bad_seed, (2, 2)), main)
    _raises(
        TypeError,
        "float16 or float32",
        lambda: ops.random_normal(seed, (2, 2), dtype=popxl.int32),
        main,
    )
    _raises(TypeError, "uint32", lambda: ops.split_random_seed(bad_seed), main)
