"""Misuse cases of issue 17 in popxl_core: stream data that does not fit, streams of another
Ir, runs keyed by names, and an addons Module that skipped ``super().__init__()``."""

from __future__ import annotations

import numpy as np

import addons
import popxl_core as popxl
from popxl_core import ops

from .misuse_cases_common import case, io_ir, session_of


def _label_ir():
    ir = popxl.Ir()
    with ir.main_graph:
        labels = popxl.h2d_stream((2,), popxl.int32, "labels")
        out = popxl.d2h_stream((2,), popxl.int32, "out")
        ops.host_store(out, ops.host_load(labels) + 0)
    return ir, labels


@case
def run_int64_label_that_int32_cannot_hold():
    ir, labels = _label_ir()
    session = session_of(ir)
    session.__enter__()
    big = np.array([1, 2**33], np.int64)  # torch's default integer dtype, past int32
    return (
        lambda: session.run({labels: big}),
        ValueError,
        [r"stream 'labels'", r"8589934592", r"int32 cannot hold"],
    )


@case
def run_float64_input_past_float32():
    ir, xs, _ = io_ir()
    session = session_of(ir)
    session.__enter__()
    return (
        lambda: session.run({xs: np.array([1.0, 1e300])}),
        ValueError,
        [r"stream 'x'", r"1e\+300", r"float32 cannot hold"],
    )


@case
def host_load_of_another_irs_stream():
    other = popxl.Ir()
    with other.main_graph:
        xs = popxl.h2d_stream((2,), popxl.float32, "x")
    ir = popxl.Ir()

    def misuse():
        with ir.main_graph:
            ops.host_load(xs)

    return misuse, ValueError, [r"host_load: stream 'x' belongs to Ir", r"make the stream in"]


@case
def run_keyed_by_stream_names():
    ir, xs, _ = io_ir()
    session = session_of(ir)
    session.__enter__()
    return (
        lambda: session.run({"x": np.ones(2, np.float32)}),
        ValueError,
        [r"keyed by the HostToDeviceStream objects, not by their names", r"'x'"],
    )


@case
def addons_module_without_super_init():
    class Scale(addons.Module):
        def __init__(self, factor):
            self.factor = factor  # forgot super().__init__()

        def build(self, x):
            return x * self.factor

    ir = popxl.Ir()

    def misuse():
        with ir.main_graph:
            Scale(2.0).create_graph(popxl.TensorSpec((2,), popxl.float32))

    return misuse, AttributeError, [r"Scale", r"did not call super\(\).__init__\(\)"]
