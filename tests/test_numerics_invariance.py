"""``Ir.numerics == "ipu"``: a row's result does not depend on how many rows are computed with it.

Batch serialisation and replication compute a batch in pieces; the IPU's numbers do not change
with the piece size, and Graphcore's tests compare the pieces with the whole batch to 7
decimals. torch's CPU kernels choose their code by shape and CPU (MKL/oneDNN by row count,
ATen's elementwise loops by element count and vector width), so these tests run the
simulator's kernels themselves on pieces of 1, 2, 3, 4 and 12 rows of a 12-row operand and
require the same bits as the whole: a CPU on which a kernel breaks that fails here, by name,
rather than as a conformance test 7 decimals off. Tolerance: none (bit for bit).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import popxl_core as popxl
from popxl_core import ops
from popxl_core.ops._positional import BLOCK, GRAIN, padded_length
from popxl_core.ops.registry import all_opdefs, get_opdef

ROWS, PIECES = 12, (1, 2, 3, 4, 12)
MATMUL_SHAPES = [
    (8, 16),
    (16, 8),
    (3, 5),
    (64, 64),
    (512, 10),
    (100, 1),
    (784, 512),
    (512, 512),
    (1000, 3),
    (33, 130),
]
POINTWISE = sorted(name for name, d in all_opdefs().items() if d.pointwise)


def _in_pieces(fn, *operands: torch.Tensor, piece: int) -> torch.Tensor:
    """``fn`` applied to each ``piece`` rows of the operands (rows: dim -2), concatenated."""
    n = operands[0].shape[-2]
    return torch.cat(
        [fn(*(o[..., i : i + piece, :] for o in operands)) for i in range(0, n, piece)], dim=-2
    )


def _rng_tensor(shape, seed: int, low: float = -3.0, high: float = 3.0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.uniform(low, high, shape).astype(np.float32))


@pytest.mark.parametrize("k,n", MATMUL_SHAPES, ids=[f"K{k}xN{n}" for k, n in MATMUL_SHAPES])
@pytest.mark.parametrize("lead", [(), (2,)], ids=["2d", "batched"])
def test_matmul_rows_do_not_depend_on_row_count(k, n, lead):
    kernel = get_opdef("MatMul").kernel_for("ipu")
    a, b = _rng_tensor((*lead, ROWS, k), seed=k), _rng_tensor((k, n), seed=n + 1)

    def mm(x):
        return kernel(x, b, output_type=None, partials_type=None, available_memory_proportion=None)

    whole = mm(a)
    for piece in PIECES:
        torch.testing.assert_close(
            _in_pieces(mm, a, piece=piece),
            whole,
            rtol=0,
            atol=0,
            msg=lambda m, p=piece: f"{p}-row pieces: {m}",
        )


def _pointwise_operands(name: str, shape) -> list[torch.Tensor]:
    arity = len(get_opdef(name).samples()[0].inputs)
    low = 0.1 if name in ("Log", "Pow") else -3.0  # in the domain, so no NaN compares unequal
    return [_rng_tensor(shape, seed=i + 10, low=low) for i in range(arity)]


@pytest.mark.parametrize("cols", [13, 16, 40])
@pytest.mark.parametrize("name", POINTWISE)
def test_pointwise_rows_do_not_depend_on_row_count(name, cols):
    opdef = get_opdef(name)
    kernel = opdef.kernel_for("ipu")
    operands = _pointwise_operands(name, (ROWS, cols))

    def run(*xs):  # an in-place kernel writes its first operand: give it a copy
        return kernel(*(x.clone() if opdef.inplace else x for x in xs)).clone()

    whole = run(*operands)
    for piece in PIECES:
        torch.testing.assert_close(
            _in_pieces(run, *operands, piece=piece),
            whole,
            rtol=0,
            atol=0,
            msg=lambda m, p=piece: f"{p}-row pieces: {m}",
        )


@pytest.mark.parametrize("name", ["Gelu", "GeluGrad", "Exp"])
def test_pointwise_rows_with_several_threads(name):
    """A tensor over ATen's one-thread limit is split between threads: each share still runs
    in whole SIMD blocks."""
    kernel = get_opdef(name).kernel_for("ipu")
    operands = _pointwise_operands(name, (ROWS, 4099))  # 49188 elements: two threads' work
    threads = torch.get_num_threads()
    torch.set_num_threads(max(2, threads))
    try:
        whole = kernel(*operands)
        for piece in PIECES:
            torch.testing.assert_close(
                _in_pieces(kernel, *operands, piece=piece), whole, rtol=0, atol=0
            )
    finally:
        torch.set_num_threads(threads)


def test_padded_length_gives_every_thread_whole_blocks():
    assert padded_length(48, 2) == BLOCK and padded_length(BLOCK, 4) == BLOCK
    for n in (GRAIN - 5, GRAIN + 1, 3 * GRAIN + 17, 10**6 + 3):
        for threads in (1, 2, 3, 4, 7, 16):
            m = padded_length(n, threads)
            assert m >= n and m % BLOCK == 0 and m - n < BLOCK * threads
            t = min(threads, -(-m // GRAIN))
            if m > GRAIN and t > 1:
                assert (-(-m // t)) % BLOCK == 0


def test_pointwise_kernels_are_the_table_kernels_under_torch_numerics():
    """``"torch"`` numerics stay eager's: no padding (eager's tails are eager's numbers)."""
    for name in POINTWISE:
        opdef = get_opdef(name)
        assert opdef.kernel_for("torch") is opdef.kernel


def _layer(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """gelu(x @ w) and its input gradient for a cotangent of ones: a hand-written program."""
    ir = popxl.Ir()
    with ir.main_graph:
        stream = popxl.h2d_stream(x.shape, popxl.float32, "x")
        wv = popxl.variable(w, name="w")
        graph = ir.create_graph(lambda t, v: ops.gelu(t @ v), stream.spec, wv)
        info = popxl.transforms.autodiff(graph)
        xt = ops.host_load(stream, "x")
        site = ops.call_with_info(graph, xt, wv)
        (dx,) = ops.call(
            info.graph,
            popxl.constant(np.ones((x.shape[0], w.shape[1]), np.float32)),
            inputs_dict=info.inputs_dict(site),
        )[:1]
        out_y = popxl.d2h_stream((x.shape[0], w.shape[1]), popxl.float32, "y")
        out_dx = popxl.d2h_stream(x.shape, popxl.float32, "dx")
        ops.host_store(out_y, site.outputs[0])
        ops.host_store(out_dx, dx)
    with popxl.Session(ir, "ipu_hw") as session:
        res = session.run({stream: x})
    return np.concatenate([res[out_y], res[out_dx]], axis=1)


def test_program_rows_do_not_depend_on_row_count():
    """A gelu layer and its input gradient (3 x 16 elements: a tail on any SIMD width)."""
    x, w = _rng_tensor((ROWS, 8), 1).numpy(), _rng_tensor((8, 16), 2).numpy()
    whole = _layer(x, w)
    for piece in PIECES:
        parts = np.concatenate([_layer(x[i : i + piece], w) for i in range(0, ROWS, piece)])
        np.testing.assert_array_equal(parts, whole, err_msg=f"{piece}-row pieces")
