"""The compiled program (fused kernels, ``out=`` reuse, views, dead-code removal) against the
plain reference interpreter (`popxl_core/sim/reference.py`), op by op over the whole op table.

Every sample of every op is built twice (forward outputs and input gradients streamed out, as
`op_harness` does) and run once compiled and once interpreted; the streamed values and the
variables after the run must be equal to the bit. Ops without samples get a program here;
`test_every_op_has_a_reference_case` fails for an op with neither.
"""

from __future__ import annotations

from typing import Callable, Dict

import numpy as np
import pytest

import addons  # noqa: F401 - registers the addons ops (ReplicatedAllReduceTP) in the table
import popxl_core as popxl
from popxl_core import ops
from popxl_core.ops.ctc_decoder import ctc_beam_search_decoder
from popxl_core.ops.registry import all_opdefs
from popxl_core.sim import CompileOptions

from .op_harness import build_sample

F32 = np.float32


def _host_io_ir():
    """HostLoad and HostStore: two transfers through a repeat loop, on two replicas."""
    ir = popxl.Ir(replication=2)
    ir.num_host_transfers = 2
    with ir.main_graph:
        w = popxl.variable(np.array([1.0, 2.0, 3.0], F32), name="w")
        x_in = popxl.h2d_stream((3,), popxl.float32, "x")
        y_out = popxl.d2h_stream((3,), popxl.float32, "y")

        def body(w):
            x = ops.host_load(x_in, "x")
            ops.host_store(y_out, ops.add(ops.mul(x, x), w))

        ops.repeat(ir.create_graph(body, w), 2, w)
    feeds = {x_in: np.arange(12, dtype=F32).reshape(2, 2, 3) / 7}
    return ir, feeds


def _remote_code_load_ir():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.float32(2.0), name="x")
        g = ir.create_graph(lambda t: t * 3.0, x.spec)
        with popxl.in_sequence():
            ops.remote_code_load(g, destination="executable")
            (y,) = ops.call(g, x)
        s = popxl.d2h_stream(y.shape, y.dtype, "y")
        ops.host_store(s, y)
    return ir, {}


def _runtime_check_ir(bound: float = 10.0):
    """A check that holds on the fed data (``x < bound``), beside the value it guards."""
    ir = popxl.Ir()
    with ir.main_graph:
        x_in = popxl.h2d_stream((3,), popxl.float32, "x")
        x = ops.host_load(x_in, "x")
        ops.runtime_check(ops.less(x, bound), "x must be below the bound", tag="bound")
        s = popxl.d2h_stream(x.shape, x.dtype, "y")
        ops.host_store(s, x * 2.0)
    return ir, {x_in: np.array([1.0, 2.0, 3.0], F32)}


def _ctc_decoder_ir():
    """A beam search over random log-probabilities, two batch entries of different lengths."""
    ir = popxl.Ir()
    log_p = np.log(np.random.default_rng(0).dirichlet(np.ones(4), size=(5, 2))).astype(F32)
    with ir.main_graph:
        x = popxl.variable(log_p, name="log_p")
        n = popxl.variable(np.array([5, 3], np.uint32), popxl.uint32, name="n")
        for i, out in enumerate(ctc_beam_search_decoder(x, n, beam_width=3, top_paths=2)):
            ops.host_store(popxl.d2h_stream(out.shape, out.dtype, f"out{i}"), out)
    return ir, {}


# ops the table gives no samples for -> a program that runs them (and its feeds)
EXTRA: Dict[str, Callable] = {
    "HostLoad": _host_io_ir,
    "HostStore": _host_io_ir,
    "RemoteCodeLoad": _remote_code_load_ir,
    "RuntimeCheck": _runtime_check_ir,
    "CtcBeamSearchDecoder": _ctc_decoder_ir,
}


def _run(ir, feeds, reference: bool) -> Dict[str, np.ndarray]:
    """Every streamed output and every variable's value after one run, by name."""
    # the compiled side as users run it (spec checks would wrap every kernel)
    session = popxl.Session(
        ir, "ipu_hw", compile_options=CompileOptions(interpret=reference, check_specs=reference)
    )
    variables = list(ir.main_graph.variables)
    with session:
        results = session.run(feeds)
        values = session.get_tensors_data(variables)
    out = {f"stream {s.tensor_id}": np.array(a) for s, a in results.items()}
    out.update({f"variable {v.id}": np.array(values[v]) for v in variables})
    return out


def assert_bitwise_equal(fast: Dict[str, np.ndarray], ref: Dict[str, np.ndarray]) -> None:
    assert fast.keys() == ref.keys()
    for k in fast:
        a, b = fast[k], ref[k]
        assert a.dtype == b.dtype and a.shape == b.shape, f"{k}: {a.dtype}{a.shape} vs {b.dtype}"
        same = a.tobytes() == b.tobytes()
        assert same, f"{k}: compiled and reference differ, max abs {np.abs(a - b).max()}"


def _sample_cases():
    for name, opdef in sorted(all_opdefs().items()):
        for i, sample in enumerate(opdef.samples() if opdef.samples else []):
            yield pytest.param(opdef, sample, id=f"{name}-{sample.name or i}")


@pytest.mark.filterwarnings("ignore::popxl_core.ops.gather.GatherIndexWarning")  # oor samples
@pytest.mark.parametrize("opdef,sample", list(_sample_cases()))
def test_sample_compiled_matches_reference(opdef, sample):
    runs = []
    for reference in (False, True):
        built = build_sample(opdef, sample)
        runs.append(_run(built.ir, {}, reference))
    assert_bitwise_equal(*runs)


@pytest.mark.parametrize("name", sorted(EXTRA))
def test_extra_compiled_matches_reference(name):
    runs = [_run(*EXTRA[name](), reference) for reference in (False, True)]
    assert_bitwise_equal(*runs)


@pytest.mark.parametrize("reference", [False, True])
def test_a_failing_runtime_check_raises_compiled_and_interpreted(reference):
    from popxl_core.ops.runtime_check import RuntimeCheckError

    ir, feeds = _runtime_check_ir(bound=2.5)  # 3.0 is not below it
    with pytest.raises(RuntimeCheckError, match="x must be below the bound") as info:
        _run(ir, feeds, reference)
    assert info.value.tag == "bound"


@pytest.mark.parametrize("name", sorted(all_opdefs()))
def test_every_op_has_a_reference_case(name):
    opdef = all_opdefs()[name]
    has_samples = opdef.samples is not None and bool(opdef.samples())
    assert has_samples or name in EXTRA, f"op {name} has no case against the reference"
    if name in EXTRA:
        ir, _ = EXTRA[name]()
        assert name in {op.type for g in ir._graphs.values() for op in g._ops}


def test_reference_does_not_compile():
    """The interpreter really is another path: no generated graph code, no fused kernels."""
    ir, feeds = _host_io_ir()
    session = popxl.Session(ir, "ipu_hw", compile_options=CompileOptions(interpret=True))
    assert type(session._program).__name__ == "ReferenceProgram"
    assert not hasattr(session._program, "namespace")
