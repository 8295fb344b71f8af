"""Shared set-up of the misuse cases (tests/misuse_cases_*.py): the registry and helpers."""

from __future__ import annotations

import numpy as np

import popxl_core as popxl
from popxl_core import ops

F32 = np.float32
HERE = r"\[at .*misuse_cases_\w+\.py:\d+\]"  # op errors point at the user's line
CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def int_var(name="iv", shape=(2, 3)):
    return popxl.variable(np.arange(np.prod(shape), dtype=np.int32).reshape(shape), name=name)


def float_var(name="fv", shape=(2, 3)):
    return popxl.variable(np.ones(shape, F32), name=name)


def io_ir(nht=1):
    """An Ir loading stream 'x' and storing 'y' once per run."""
    ir = popxl.Ir()
    ir.num_host_transfers = nht
    with ir.main_graph:
        xs = popxl.h2d_stream((2,), popxl.float32, "x")
        ys = popxl.d2h_stream((2,), popxl.float32, "y")
        ops.host_store(ys, ops.host_load(xs) + 1.0)
    return ir, xs, ys


def session_of(ir):
    return popxl.Session(ir, "ipu_hw")


def in_main(ir, fn):
    """``fn`` run while building the main graph of ``ir`` (where the user's statement is)."""

    def run():
        with ir.main_graph:
            return fn()

    return run


def in_main_graph(fn, exc, patterns):
    ir = popxl.Ir()

    def misuse():
        with ir.main_graph:
            fn()

    return misuse, exc, patterns
