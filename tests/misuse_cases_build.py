"""Misuse cases 1-4 of issue 8: transfer counts, float-only ops, a frozen Ir, factory arguments."""

from __future__ import annotations

import numpy as np
import torch

import addons
import popxl_core as popxl
from popxl_core import ops

from .misuse_cases_common import (
    CASES,
    F32,
    HERE,
    case,
    float_var,
    in_main,
    in_main_graph,
    int_var,
    io_ir,
    session_of,
)


# 1. num_host_transfers vs the transfers a run performs ----------------------------------------
# (fewer or more transfers than num_host_transfers only warn, as PopXL runs such programs:
# tests/test_apps_semantics.py; an If whose branches disagree is still an error at run time)
@case
def session_run_if_branch_skips_load():
    ir = popxl.Ir()
    with ir.main_graph:
        xs = popxl.h2d_stream((2,), popxl.float32, "x")
        flag = popxl.variable(False, popxl.bool, name="flag")
        then_g = ir.create_graph(lambda: ops.host_load(xs) * 2.0)
        else_g = ir.create_graph(lambda: ops.init((2,), popxl.float32, "z"))
        (out,) = ops.conditional(flag, then_g, else_g)
        ops.host_store(popxl.d2h_stream((2,), popxl.float32, "y"), out)
    session = session_of(ir)

    def run():
        with session:
            session.run({xs: np.ones(2, F32)})

    return run, RuntimeError, [r"'x' is loaded 0 times", r"num_host_transfers is 1", r"If"]


@case
def session_second_session_on_same_ir_while_attached():
    ir, _, _ = io_ir()
    first = session_of(ir)
    first.__enter__()  # attached: a second Session would hold the same variables again
    return lambda: session_of(ir), RuntimeError, [r"is owned by Session\[Ir\[id=\d+\]", "attached"]


# 2. float-only ops on integer tensors (op creation) ------------------------------------------
_FLOAT_ONLY = {
    "sqrt": ops.sqrt,
    "exp": ops.exp,
    "exp_": ops.exp_,
    "log": ops.log,
    "log2": ops.log2,
    "sin": ops.sin,
    "cos": ops.cos,
    "tanh": ops.tanh,
    "ceil": ops.ceil,
    "floor": ops.floor,
    "sigmoid": ops.sigmoid,
    "relu": ops.relu,
    "relu_": ops.relu_,
    "gelu": ops.gelu,
    "gelu_": ops.gelu_,
    "geluerf": ops.geluerf,
    "swish": ops.swish,
    "softmax": lambda t: ops.softmax(t, -1),
    "log_softmax": lambda t: ops.log_softmax(t, -1),
    "mean": ops.mean,
}


def _float_only_case(fn):
    def make():
        ir = popxl.Ir()
        with ir.main_graph:
            t = int_var()
            before = len(ir.main_graph.ops)

            def misuse():
                try:
                    fn(t)
                finally:  # nothing half-built is left behind
                    assert len(ir.main_graph.ops) == before

        return (
            in_main(ir, misuse),
            TypeError,
            [r"iv \(2, 3\) int32", "floating point", r"ops\.cast", HERE],
        )

    return make


for _name, _fn in _FLOAT_ONLY.items():
    CASES[f"op_{_name}_of_int_tensor"] = _float_only_case(_fn)


@case
def op_group_norm_of_int_tensor():
    ir = popxl.Ir()
    with ir.main_graph:
        t = int_var(shape=(2, 4))
        w = popxl.variable(np.ones(4, np.int32), name="w")
    return (
        in_main(ir, lambda: ops.group_norm(t, w, w, 2)),
        TypeError,
        [r"iv \(2, 4\) int32", "ops.cast"],
    )


@case
def op_max_pool_of_int_tensor():
    ir = popxl.Ir()
    with ir.main_graph:
        t = int_var(shape=(1, 1, 4, 4))
    return (
        in_main(ir, lambda: ops.max_pool(t, (2, 2))),
        TypeError,
        [r"iv \(1, 1, 4, 4\) int32", "ops.cast"],
    )


# 3. the Ir changed after a Session was built on it --------------------------------------------
def _frozen(what):
    ir, _, _ = io_ir()
    with ir.main_graph:
        x = float_var("w")
    session = session_of(ir)
    return ir, x, session


# (adding ops, variables, streams or graphs after the Session only warns, as PopXL allows it:
# tests/test_peer_surface.py; the settings a Session reads while it runs are still refused)
@case
def frozen_ir_num_host_transfers():
    ir, _, _ = _frozen("nht")

    def misuse():
        ir.num_host_transfers = 4

    return misuse, RuntimeError, [r"num_host_transfers to 4", r"owned by Session"]


@case
def frozen_ir_replication_factor():
    ir, _, _ = _frozen("rf")

    def misuse():
        ir.replication_factor = 2

    return misuse, RuntimeError, [r"replication_factor"]


# 4. numpy/torch dtypes and int shapes in popxl factories --------------------------------------
@case
def factory_h2d_stream_numpy_dtype():
    return in_main_graph(
        lambda: popxl.h2d_stream((2, 3), np.float32, "x"),
        TypeError,
        [r"h2d_stream\('x'\)", r"expected a popxl dtype", r"np\.float32", r"popxl\.float32"],
    )


@case
def factory_d2h_stream_torch_dtype():
    return in_main_graph(
        lambda: popxl.d2h_stream((2,), torch.float16, "y"),
        TypeError,
        [r"d2h_stream\('y'\)", r"torch\.float16", r"popxl\.float16"],
    )


@case
def factory_variable_torch_dtype():
    return in_main_graph(
        lambda: popxl.variable(np.ones(3), dtype=torch.float16, name="w"),
        TypeError,
        [r"variable\('w'\)", r"torch\.float16"],
    )


@case
def factory_constant_numpy_dtype():
    return in_main_graph(
        lambda: popxl.constant([1, 2], dtype=np.dtype("int32"), name="c"),
        TypeError,
        [r"constant\('c'\)", r"numpy dtype int32", r"popxl\.int32"],
    )


@case
def factory_h2d_stream_int_shape():
    return in_main_graph(
        lambda: popxl.h2d_stream(3, popxl.float32, "x"),
        TypeError,
        [r"h2d_stream\('x'\)", r"expected a shape tuple", r"int 3", r"\(3,\)"],
    )


@case
def factory_h2d_stream_negative_dim():
    return in_main_graph(
        lambda: popxl.h2d_stream((2, -1), popxl.float32, "x"),
        ValueError,
        [r"h2d_stream\('x'\)", r"negative dimension -1", r"\(2, -1\)"],
    )


@case
def factory_h2d_stream_float_dim():
    return in_main_graph(
        lambda: popxl.h2d_stream((2, 1.5), popxl.float32, "x"),
        TypeError,
        [r"h2d_stream\('x'\)", r"1\.5", "float"],
    )


@case
def factory_init_negative_dim():
    return in_main_graph(
        lambda: ops.init((-3,), popxl.float32, "buf"), ValueError, [r"init\('buf'\)", r"-3"]
    )


@case
def factory_tensor_spec_int_shape():
    return (
        lambda: popxl.TensorSpec(4, popxl.float32),
        TypeError,
        [r"TensorSpec", r"int 4", r"\(4,\)"],
    )


@case
def factory_graph_input_numpy_dtype():
    ir = popxl.Ir()

    def build():
        popxl.graph_input((2,), np.float32, "a")

    return (lambda: ir.create_graph(build), TypeError, [r"graph_input\('a'\)", r"np\.float32"])


@case
def factory_variable_ragged_data():
    return in_main_graph(
        lambda: popxl.variable([[1.0, 2.0], [3.0]], name="ragged"),
        ValueError,
        [r"variable\('ragged'\)", r"ragged"],
    )


@case
def factory_variable_string_data():
    return in_main_graph(
        lambda: popxl.variable("0.5", name="s"), TypeError, [r"variable\('s'\)", r"not numeric"]
    )


@case
def factory_variable_of_graph_tensor():
    ir = popxl.Ir()
    with ir.main_graph:
        t = float_var("src")

    def misuse():
        with ir.main_graph:
            popxl.variable(t, name="copy")

    return misuse, TypeError, [r"variable\('copy'\)", r"graph tensor", "src"]


@case
def factory_cast_to_numpy_dtype():
    ir = popxl.Ir()
    with ir.main_graph:
        t = float_var()
    return lambda: ops.cast(t, np.int32), TypeError, [r"cast", r"popxl dtype"]


@case
def addons_variable_factory_numpy_dtype():
    ir = popxl.Ir()

    def misuse():
        with ir.main_graph:
            addons.VariableFactory(np.zeros(3, F32), dtype=np.float32, name="w")

    return misuse, TypeError, [r"VariableFactory\('w'\)", r"np\.float32", r"popxl\.float32"]


@case
def addons_variable_factory_fraction_into_int():
    ir = popxl.Ir()
    with ir.main_graph:
        f = addons.VariableFactory(np.full(3, 0.5, F32), dtype=popxl.int32, name="w")

    def misuse():
        with ir.main_graph:
            f.create_tensor("w")

    return misuse, ValueError, [r"'w'", r"0\.5 does not fit int32", r"become 0"]


@case
def addons_module_add_variable_input_torch_dtype():
    class Lin(addons.Module):
        def build(self, x):
            w = self.add_variable_input("weight", np.ones((2, 2), F32), dtype=torch.float32)
            return x @ w

    ir = popxl.Ir()

    def misuse():
        with ir.main_graph:
            Lin().create_graph(popxl.TensorSpec((2, 2), popxl.float32))

    return misuse, TypeError, [r"'weight'", r"torch\.float32", r"popxl\.float32"]
