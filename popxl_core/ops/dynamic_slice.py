"""DynamicSlice and DynamicUpdate (out of place and in place): a region of static sizes at a
runtime index, read or written.
"""

from __future__ import annotations

import numpy as np
import torch

from ..tensor import Tensor
from ._utils import rand, spec
from .registry import OpDef, Sample, copy_cost, create_op, register

__all__ = ["dynamic_slice", "dynamic_update", "dynamic_update_"]


# DynamicSlice / DynamicUpdate -----------------------------------------------------------------
def _check_dynamic(shape, index, axes, sizes, what: str) -> None:
    if not index.dtype.is_int:
        raise TypeError(f"{what} index must be an integer tensor, got {index.dtype.name}")
    if index.shape != (len(axes),):
        raise ValueError(
            f"{what} index must have shape ({len(axes)},) (one offset per axis "
            f"{list(axes)}), got {index.shape}"
        )
    if len(axes) != len(sizes):
        raise ValueError(f"{what}: axes {list(axes)} and sizes {list(sizes)} differ in length")
    for a, s in zip(axes, sizes):
        if not 0 <= a < len(shape) or not 0 <= s <= shape[a]:
            raise ValueError(f"{what}: size {s} on axis {a} does not fit shape {shape}")


def _sliced_shape(shape, axes, sizes) -> tuple[int, ...]:
    out = list(shape)
    for a, s in zip(axes, sizes):
        out[a] = s
    return tuple(out)


def _region(x, index, axes, sizes):
    # Offsets are clamped so the window stays inside the tensor (like jax.lax.dynamic_slice).
    for a, s, o in zip(axes, sizes, index.tolist()):
        x = x.narrow(a, min(max(int(o), 0), x.shape[a] - s), s)
    return x


def _dynamic_slice_infer(ins, axes, sizes, no_overlap):
    _check_dynamic(ins[0].shape, ins[1], axes, sizes, "dynamic_slice")
    return [spec(_sliced_shape(ins[0].shape, axes, sizes), ins[0].dtype)]


def _dynamic_slice_kernel(x, index, axes, sizes, no_overlap):
    return _region(x, index, axes, sizes)


def _zeros(shape, dtype) -> Tensor:
    from . import init

    return init(shape, dtype, "zeros", "zero")


def _dynamic_slice_grad(ctx):
    t, a = ctx.op.inputs[0], ctx.attrs
    return [
        dynamic_update(
            _zeros(t.shape, t.dtype),
            ctx.input(1),
            ctx.grad_output(0),
            a["axes"],
            a["sizes"],
            a["no_overlap"],
        ),
        None,
    ]


def _i32(*v):
    return np.array(v, dtype=np.int32)


DYNAMIC_SLICE = register(
    OpDef(
        "DynamicSlice",
        _dynamic_slice_infer,
        _dynamic_slice_kernel,
        grad=_dynamic_slice_grad,
        cost=copy_cost,
        view=True,
        out_name="dynamicslice_out",
        fp16_in_fp32=False,
        samples=lambda: [
            Sample(
                [rand(5, 4), _i32(1, 2)],
                lambda x, i: dynamic_slice(x, i, [0, 1], [3, 2], True),
                lambda x, i: x[int(i[0]) : int(i[0]) + 3, int(i[1]) : int(i[1]) + 2],
            ),
            Sample(
                [rand(5, 4, seed=1), np.array([3], np.uint32)],
                lambda x, i: dynamic_slice(x, i, [0], [2], False),
                lambda x, i: x[3:5],
                name="uint32",
            ),
        ],
    )
)


def dynamic_slice(
    t: Tensor, index: Tensor, axes: list[int], sizes: list[int], no_overlap: bool
) -> Tensor:
    """The window of ``sizes`` on ``axes`` of ``t`` starting at the run-time offsets ``index``."""
    attrs = {
        "axes": tuple(int(a) for a in axes),
        "sizes": tuple(int(s) for s in sizes),
        "no_overlap": bool(no_overlap),
    }
    return create_op(DYNAMIC_SLICE, [t, index], attrs)[0]


def _dynamic_update_infer(ins, axes, sizes, no_overlap):
    t, index, upd = ins
    _check_dynamic(t.shape, index, axes, sizes, "dynamic_update")
    want = _sliced_shape(t.shape, axes, sizes)
    if upd.shape != want or upd.dtype != t.dtype:
        raise ValueError(
            f"dynamic_update: t_update must be {want} {t.dtype.name}, got "
            f"{upd.shape} {upd.dtype.name}"
        )
    return [t]


def _dynamic_update_kernel(x, index, upd, axes, sizes, no_overlap):
    out = x.clone()
    _region(out, index, axes, sizes).copy_(upd)
    return out


def _dynamic_update_inplace_kernel(x, index, upd, axes, sizes, no_overlap):
    _region(x, index, axes, sizes).copy_(upd)
    return x


def _dynamic_update_grad(ctx):
    g, a, index = ctx.grad_output(0), ctx.attrs, ctx.input(1)
    upd = ctx.op.inputs[2]
    dt = dynamic_update(
        g, index, _zeros(upd.shape, upd.dtype), a["axes"], a["sizes"], a["no_overlap"]
    )
    return [dt, None, dynamic_slice(g, index, a["axes"], a["sizes"], a["no_overlap"])]


def _update_reference(x, i, u):
    o = int(i[0])
    return torch.cat([x[:, :o], u, x[:, o + u.shape[1] :]], 1)


def _dynamic_update_samples(fn):
    def samples():
        return [
            Sample(
                [rand(3, 5), _i32(1), rand(3, 2, seed=1)],
                lambda x, i, u: fn(x, i, u, [1], [2], True),
                _update_reference,
            )
        ]

    return samples


DYNAMIC_UPDATE = register(
    OpDef(
        "DynamicUpdate",
        _dynamic_update_infer,
        _dynamic_update_kernel,
        grad=_dynamic_update_grad,
        cost=copy_cost,
        out_name="dynamicupdate_out",
        fp16_in_fp32=False,
        samples=_dynamic_update_samples(lambda *a: dynamic_update(*a)),
    )
)
DYNAMIC_UPDATE_INPLACE = register(
    OpDef(
        "DynamicUpdateInplace",
        _dynamic_update_infer,
        _dynamic_update_inplace_kernel,
        grad=_dynamic_update_grad,
        cost=copy_cost,
        inplace=(0,),
        out_name="dynamicupdate_out",
        fp16_in_fp32=False,
        samples=_dynamic_update_samples(lambda x, *a: dynamic_update_(x * 1.0, *a)),
    )
)


def _dynamic_update_attrs(axes, sizes, no_overlap) -> dict:
    return {
        "axes": tuple(int(a) for a in axes),
        "sizes": tuple(int(s) for s in sizes),
        "no_overlap": bool(no_overlap),
    }


def dynamic_update(
    t: Tensor, index: Tensor, t_update: Tensor, axes: list[int], sizes: list[int], no_overlap: bool
) -> Tensor:
    """A copy of ``t`` with the window at run-time offsets ``index`` replaced by ``t_update``."""
    return create_op(
        DYNAMIC_UPDATE, [t, index, t_update], _dynamic_update_attrs(axes, sizes, no_overlap)
    )[0]


def dynamic_update_(
    t: Tensor, index: Tensor, t_update: Tensor, axes: list[int], sizes: list[int], no_overlap: bool
) -> Tensor:
    """Like `dynamic_update`, but writes ``t`` in place."""
    return create_op(
        DYNAMIC_UPDATE_INPLACE, [t, index, t_update], _dynamic_update_attrs(axes, sizes, no_overlap)
    )[0]
