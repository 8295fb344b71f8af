"""Host IO, initialisation, printing and placement ops."""

from __future__ import annotations

import sys
from typing import Optional

import torch

from .. import dtypes
from ..arg_checks import checked_dtype, checked_shape
from ..context import gcg
from ..streams import DeviceToHostStream, HostToDeviceStream
from ..tensor import Tensor, TensorSpec
from ._print_format import format_tensor, print_options
from ._utils import rand
from .registry import Cost, OpDef, Sample, create_op, no_cost, register

__all__ = ["host_load", "host_store", "init", "print_tensor", "ipu_copy", "io_tile_copy"]


def _transfer_cost(ins, outs, attrs) -> Cost:
    return Cost(0, sum(s.nbytes for s in (*ins, *outs)))


# Init ---------------------------------------------------------------------------------
def _init_infer(ins, shape, dtype, init_type, meta_shape=()):
    return [TensorSpec(shape, dtype, meta_shape)]


def _init_kernel(shape, dtype, init_type, meta_shape=()):
    # 'undef' is also zero-filled: a simulator should be deterministic.
    return torch.zeros(shape, dtype=dtype.as_torch())


def _init_samples():
    return [
        Sample([], lambda: init((2, 3), dtypes.float32, "z"), lambda: torch.zeros(2, 3), grad=False)
    ]


INIT = register(
    OpDef(
        "Init", _init_infer, _init_kernel, cost=no_cost, samples=_init_samples, out_name="init_out"
    )
)


def init(
    shape, dtype: dtypes.dtype, name: Optional[str] = None, init_type: str = "zero", meta_shape=None
) -> Tensor:
    """A new tensor in the current graph, zero-filled ('zero') or left undefined ('undef')."""
    where = f"ops.init({name or 'init'!r})"
    shape, dtype = checked_shape(shape, where), checked_dtype(dtype, where)
    if init_type not in ("zero", "undef"):
        raise ValueError(f"init_type must be 'zero' or 'undef', got {init_type!r}.")
    attrs = dict(
        shape=tuple(shape), dtype=dtype, init_type=init_type, meta_shape=tuple(meta_shape or ())
    )
    return create_op(INIT, [], attrs, out_names=[name or "init"])[0]


# HostLoad / HostStore ---------------------------------------------------------------
def _emit_host_load(op, em) -> None:
    s = em.bind_global("s", op.attrs["stream"])
    read = getattr(em, "read", None)  # the compiler's emitter knows; the interpreter loads
    if read is not None and op.outputs[0] not in read:  # consumed, not read (an option off)
        em.emit(f"RT.skip({s})")
    else:
        em.emit(f"{em.name(op.outputs[0])} = RT.load({s})")


def _emit_host_store(op, em) -> None:
    s = em.bind_global("s", op.attrs["stream"])
    em.emit(f"RT.store({s}, {em.name(op.inputs[0])})")


HOST_LOAD = register(
    OpDef(
        "HostLoad",
        lambda ins, stream: [ins[0]],
        emit=_emit_host_load,
        cost=_transfer_cost,
        out_name="hostload",
        side_effect=True,
        # the Init buffer it formally reads is overwritten whole, so it may be dropped
        tested_by="tests/test_session.py::test_host_load_store",
        ignores_inputs=True,
    )
)
HOST_STORE = register(
    OpDef(
        "HostStore",
        lambda ins, stream: [],
        emit=_emit_host_store,
        cost=_transfer_cost,
        side_effect=True,
        tested_by="tests/test_session.py::test_host_load_store",
        reads_only=True,  # a copy to the host
    )
)


def _check_same_ir(stream, what: str) -> None:
    """A stream belongs to the Ir it was made in: another Ir's Session would never feed it."""
    ir = gcg().ir
    if stream._stream_tensor.ir is not ir:
        raise ValueError(
            f"{what}: stream {stream.tensor_id!r} belongs to {stream._stream_tensor.ir!r}, not to "
            f"{ir!r} being built; make the stream in this Ir (popxl.h2d_stream/d2h_stream "
            "inside `with ir.main_graph:`)."
        )


def host_load(h2d_stream: HostToDeviceStream, name: Optional[str] = None) -> Tensor:
    """Load the next value of ``h2d_stream`` from the host."""
    if not isinstance(h2d_stream, HostToDeviceStream):
        raise TypeError(f"host_load expects a HostToDeviceStream, got {type(h2d_stream).__name__}.")
    _check_same_ir(h2d_stream, "host_load")
    name = name or h2d_stream._stream_tensor.name
    buf = init(h2d_stream.shape, h2d_stream.dtype, f"{name}_init", "undef")
    return create_op(HOST_LOAD, [buf], {"stream": h2d_stream}, out_names=[f"{name}_hostload"])[0]


def host_store(d2h_stream: DeviceToHostStream, t: Tensor) -> None:
    """Send ``t`` to the host through ``d2h_stream``."""
    if not isinstance(d2h_stream, DeviceToHostStream):
        raise TypeError(
            f"host_store expects a DeviceToHostStream, got {type(d2h_stream).__name__}."
        )
    _check_same_ir(d2h_stream, "host_store")
    if t.shape != d2h_stream.shape or t.dtype is not d2h_stream.dtype:
        raise ValueError(
            f"host_store: tensor {t.id!r} {t.shape} {t.dtype.name} does not match stream "
            f"{d2h_stream.tensor_id!r} {d2h_stream.shape} {d2h_stream.dtype.name}."
        )
    create_op(HOST_STORE, [t], {"stream": d2h_stream})


# PrintTensor -----------------------------------------------------------------------
def _print_kernel(x, title, print_self, print_gradient, opts):
    if print_self:
        # float8 prints its values (numpy has no float8; its bits would read as small ints)
        shown = x.float() if x.dtype in (torch.float8_e4m3fnuz, torch.float8_e5m2fnuz) else x
        print(format_tensor(title, shown.detach().cpu().numpy(), opts), file=sys.stderr, flush=True)
    return x.clone()


def _print_grad(ctx):
    g = ctx.grad_output(0)
    if ctx.attrs["print_gradient"]:
        # PopXL titles the gradient "<title>_gradient" and prints it with the same options
        attrs = dict(ctx.attrs, title=f"{ctx.attrs['title']}_gradient", print_gradient=False)
        return [create_op(PRINT_TENSOR, [g], attrs)[0]]
    return [g]


PRINT_TENSOR = register(
    OpDef(
        "PrintTensor",
        lambda ins, **kw: [ins[0]],
        _print_kernel,
        grad=_print_grad,
        cost=no_cost,
        side_effect=True,
        out_name="print_out",
        samples=lambda: [Sample([rand(2, 3)], lambda x: print_tensor(x, "x"), lambda x: x * 1)],
    )
)


def print_tensor(
    t: Tensor,
    title: Optional[str] = None,
    print_self: bool = True,
    print_gradient: bool = False,
    summarise_threshold: int = 1000,
    edge_items: int = 3,
    max_line_width: int = 75,
    digits: int = 8,
    float_format: str = "auto",
    separator: str = " ",
    open_bracket: str = "[",
    close_bracket: str = "]",
    layout: str = "numpy",
) -> Tensor:
    """Print ``t`` to stderr when the op runs; returns a copy of ``t``.

    As in PopXL the title defaults to ``"print_<name>"``, and with ``print_gradient`` the
    gradient is printed as ``"<title>_gradient"``; the values are written between
    ``open_bracket`` and ``close_bracket``, separated by ``separator``. ``layout="poplar"``
    lays the text out as Poplar's PrintTensor does (PopTorch's ``ipu_print_tensor``).
    """
    opts = print_options(
        summarise_threshold,
        edge_items,
        max_line_width,
        digits,
        float_format,
        separator,
        open_bracket,
        close_bracket,
        layout,
    )
    title = f"print_{t.name}" if title is None else title
    attrs = dict(title=title, print_self=print_self, print_gradient=print_gradient, opts=opts)
    return create_op(PRINT_TENSOR, [t], attrs)[0]


# IpuCopy / IoTileCopy ---------------------------------------------------------------
IPU_COPY = register(
    OpDef(
        "IpuCopy",
        lambda ins, destination, source: [ins[0]],
        lambda x, destination, source: x.clone(),
        grad=lambda ctx: [ctx.grad_output(0)],
        cost=_transfer_cost,
        out_name="ipucopy_out",
        samples=lambda: [Sample([rand(2, 3)], lambda x: ipu_copy(x, 1), lambda x: x * 1)],
    )
)

IO_TILE_COPY = register(
    OpDef(
        "IoTileCopy",
        lambda ins: [ins[0]],
        lambda x: x.clone(),
        grad=lambda ctx: [ctx.grad_output(0)],
        cost=_transfer_cost,
        out_name="iotilecopy_out",
        samples=lambda: [Sample([rand(4)], lambda x: io_tile_copy(x), lambda x: x * 1)],
    )
)


def ipu_copy(t: Tensor, destination: int, source: Optional[int] = None) -> Tensor:
    """Copy ``t`` to virtual IPU ``destination``."""
    from ..context import ipu

    src = t.ipu if source is None else source
    with ipu(destination):
        out = create_op(
            IPU_COPY, [t], {"destination": destination, "source": src}, check_placement=False
        )[0]
    return out


def io_tile_copy(t: Tensor) -> Tensor:
    """Copy ``t`` between the compute and IO tile sets."""
    from ..context import get_current_context

    ctx = get_current_context()
    prev = ctx.io_tile_set
    ctx.io_tile_set = t.tile_set != "io"
    try:
        return create_op(IO_TILE_COPY, [t], {}, check_placement=False)[0]
    finally:
        ctx.io_tile_set = prev
