"""Float8 ops: ``pow2scale_cast_to_fp8`` / ``pow2scale_cast_from_fp8`` and the matmul and
convolution of float8 operands with a power-of-two output scale.

``log2_scale`` is an int32 scalar tensor (a Python int becomes a constant); a value outside
[-32, 32) raises from `Session.run`, naming the op, unless the session option
``throwIfLog2ScaleTensorNotInRange`` is False when the Session is built (PopART then skips its
check, and calls the result undefined): the scale is then taken modulo 64 into [-32, 32), the
6-bit signed field of the float8 metadata that holds it on the IPU. Casts to float8 round to
nearest even and give NaN beyond the format's range (the IPU's default); see
`popxl_core.fp8_utils` for the formats. The float8 matmul and convolution multiply exactly (a
float8 product fits float32) and accumulate in float32, then scale by ``2**log2_scale`` and
round to float16, the output type PopXL gives them. None of these ops has a gradient (as in PopXL).
"""

from __future__ import annotations

import torch

from .. import dtypes, fp8_utils
from ..errors import OpDataError
from ..tensor import Tensor, constant
from . import _spatial as sp
from ._conv_common import _attrs, _check_channels, _conv_out_sizes, _public_params
from ._utils import rand, spec
from .conv import _conv_kernel
from .matmul import matmul_shape
from .registry import Cost, OpDef, Sample, create_op, register

__all__ = [
    "pow2scale_cast_to_fp8",
    "pow2scale_cast_from_fp8",
    "matmul_pow2scaled",
    "conv_pow2scaled",
]

_FP8 = (dtypes.float8_143, dtypes.float8_152)


# the kernels' keyword for the session option, bound when a Session compiles (`OpDef`)
_OPTION = {"range_check": "throwIfLog2ScaleTensorNotInRange"}


def _scale(log2_scale: torch.Tensor, range_check: bool = True) -> float:
    """``2**log2_scale`` for a run-time scale; outside [-32, 32) an OpDataError, or without
    ``range_check`` the scale wrapped into that range (its 6-bit field on the IPU)."""
    s = int(log2_scale)
    low, high = fp8_utils.LOG2_SCALE_RANGE
    if not low <= s < high:
        if range_check:
            raise OpDataError(f"log2_scale is {s}; it must be in [{low}, {high}).")
        s = (s - low) % (high - low) + low
    return 2.0**s


def _scale_tensor(log2_scale, where: str) -> Tensor:
    if isinstance(log2_scale, Tensor):
        return log2_scale
    if isinstance(log2_scale, bool) or not isinstance(log2_scale, int):
        raise TypeError(
            f"{where}: log2_scale must be an int32 Tensor or an int, got {log2_scale!r}."
        )
    fp8_utils.check_log2_scale(log2_scale, where)
    return constant(log2_scale, dtypes.int32, "log2_scale")


def _check_scale(s, where: str) -> None:
    # PopXL's order and error classes: the shape (ValueError), then the dtype (TypeError)
    if tuple(s.shape) != ():
        raise ValueError(
            f"{where}: log2_scale must be a scalar tensor, got shape {tuple(s.shape)}."
        )
    if s.dtype != dtypes.int32:
        raise TypeError(f"{where}: log2_scale must be of type popxl.int32, got {s.dtype.name}.")


def _check_fp8(s, where: str) -> None:
    if s.dtype not in _FP8:
        raise TypeError(f"{where}: the input must be float8_143 or float8_152, got {s.dtype.name}.")


# Pow2ScaleThenCast / CastThenPow2Scale -------------------------------------------------------
def _to_infer(ins, data_type):
    x, s = ins
    if x.dtype not in (dtypes.float16, dtypes.float32):
        raise TypeError(
            f"pow2scale_cast_to_fp8 needs a float16 or float32 input, got {x.dtype.name}."
        )
    _check_scale(s, "pow2scale_cast_to_fp8")
    return [spec(x.shape, data_type)]


def _to_kernel(x, log2_scale, data_type, range_check=True):
    y = x.to(torch.float32) * _scale(log2_scale, range_check)
    return y.to(fp8_utils.torch_fp8_dtype(data_type))


def _from_infer(ins, data_type):
    x, s = ins
    _check_fp8(x, "pow2scale_cast_from_fp8")
    _check_scale(s, "pow2scale_cast_from_fp8")
    return [spec(x.shape, data_type)]


def _from_kernel(x, log2_scale, data_type, range_check=True):
    return (x.to(torch.float32) * _scale(log2_scale, range_check)).to(data_type.as_torch())


def pow2scale_cast_to_fp8(t: Tensor, log2_scale, data_type=dtypes.float8_143) -> Tensor:
    """``cast(t * 2**log2_scale)`` to ``data_type`` (float8_143 or float8_152)."""
    if data_type not in _FP8:
        raise TypeError(
            f"pow2scale_cast_to_fp8: data_type must be float8_143 or float8_152, got {data_type!r}."
        )
    s = _scale_tensor(log2_scale, "pow2scale_cast_to_fp8")
    return create_op(TO_FP8, [t, s], {"data_type": data_type})[0]


def pow2scale_cast_from_fp8(t: Tensor, log2_scale, data_type=dtypes.float16) -> Tensor:
    """``cast(t) * 2**log2_scale`` from float8 to ``data_type`` (float16 or float32)."""
    if data_type not in (dtypes.float16, dtypes.float32):
        raise TypeError(
            f"pow2scale_cast_from_fp8: data_type must be float16 or float32, got {data_type!r}."
        )
    s = _scale_tensor(log2_scale, "pow2scale_cast_from_fp8")
    return create_op(FROM_FP8, [t, s], {"data_type": data_type})[0]


def _round_trip_ref(s: int, fmt):
    def ref(x, _s):
        y = (x.float() * 2.0**s).to(fp8_utils.torch_fp8_dtype(fmt)).float() * 2.0**-s
        return y.half()

    return ref


def _cast_samples():
    x = rand(4, 6, low=-300, high=300, seed=500).astype("float16")
    x[0, :3] = [1e4, -6e4, 0.0]  # beyond float8_143's range at these scales: NaN
    out = []
    for fmt in _FP8:
        for s in (-3, 0, 2):
            out.append(
                Sample(
                    [x, torch.tensor(s, dtype=torch.int32).numpy()],
                    lambda a, sc, f=fmt: pow2scale_cast_from_fp8(
                        pow2scale_cast_to_fp8(a, sc, f), 0 - sc
                    ),
                    _round_trip_ref(s, fmt),
                    grad=False,
                    rtol=0,
                    atol=0,
                    name=f"{fmt.name}_s{s}",
                )
            )
    return out


_cast_cost = lambda ins, outs, attrs: Cost(outs[0].nelms, ins[0].nbytes + outs[0].nbytes)

TO_FP8 = register(
    OpDef(
        "Pow2ScaleThenCast",
        _to_infer,
        _to_kernel,
        cost=_cast_cost,
        samples=_cast_samples,
        fp16_in_fp32=False,
        session_options=_OPTION,
    )
)
FROM_FP8 = register(
    OpDef(
        "CastThenPow2Scale",
        _from_infer,
        _from_kernel,
        cost=_cast_cost,
        samples=_cast_samples,
        fp16_in_fp32=False,
        session_options=_OPTION,
    )
)


# MatMulPow2Scaled -----------------------------------------------------------------------------
def _mm_infer(ins):
    a, b, s = ins
    _check_fp8(a, "matmul_pow2scaled lhs")
    _check_fp8(b, "matmul_pow2scaled rhs")
    _check_scale(s, "matmul_pow2scaled")
    return [spec(matmul_shape(tuple(a.shape), tuple(b.shape)), dtypes.float16)]


def pow2scaled_kernel(kernel):
    """The kernel of a pow2-scaled float8 op: ``kernel`` on the operands decoded to float32,
    times ``2**log2_scale``, as float16 (the float8 ops' output type)."""

    def run(x, w, log2_scale, range_check=True, **attrs):
        y = kernel(x.to(torch.float32), w.to(torch.float32), **attrs)
        return (y * _scale(log2_scale, range_check)).half()

    return run


_mm_kernel = pow2scaled_kernel(torch.matmul)


def _mm_cost(ins, outs, attrs) -> Cost:
    k = ins[0].shape[-1]
    return Cost(2 * outs[0].nelms * k, sum(s.nbytes for s in (*ins, *outs)))


def matmul_pow2scaled(
    lhs: Tensor, rhs: Tensor, log2_scale, available_memory_proportion: float | None = None
) -> Tensor:
    """``(lhs @ rhs) * 2**log2_scale`` of float8 operands, as float16."""
    s = _scale_tensor(log2_scale, "matmul_pow2scaled")
    return create_op(MATMUL_FP8, [lhs, rhs, s], {}, out_names=["matmul_out"])[0]


def _fp8_of(x, fmt, s):
    return (x.float() * 2.0**s).to(fp8_utils.torch_fp8_dtype(fmt)).float()


def _mm_samples():
    a = rand(3, 5, low=-4, high=4, seed=510).astype("float16")
    b = rand(5, 2, low=-4, high=4, seed=511).astype("float16")
    out = []
    for fa, fb, s in (
        (dtypes.float8_143, dtypes.float8_143, -2),
        (dtypes.float8_143, dtypes.float8_152, 3),
    ):

        def build(x, y, sc, fa=fa, fb=fb, s=s):
            return matmul_pow2scaled(
                pow2scale_cast_to_fp8(x, 0, fa), pow2scale_cast_to_fp8(y, 0, fb), s
            )

        def ref(x, y, _sc, fa=fa, fb=fb, s=s):
            return (_fp8_of(x, fa, 0) @ _fp8_of(y, fb, 0) * 2.0**s).half()

        out.append(
            Sample(
                [a, b, torch.tensor(s, dtype=torch.int32).numpy()],
                build,
                ref,
                grad=False,
                rtol=0,
                atol=0,
                name=f"{fa.name}_{fb.name}",
            )
        )
    return out


MATMUL_FP8 = register(
    OpDef(
        "MatMulPow2Scaled",
        _mm_infer,
        _mm_kernel,
        cost=_mm_cost,
        samples=_mm_samples,
        fp16_in_fp32=False,
        session_options=_OPTION,
        popxl_type="MatMul",
    )
)


# ConvPow2Scaled -------------------------------------------------------------------------------
def _conv_infer(ins, stride, pads, dilation, groups):
    x, w, s = ins
    _check_fp8(x, "conv_pow2scaled input")
    _check_fp8(w, "conv_pow2scaled weight")
    _check_scale(s, "conv_pow2scaled")
    _check_channels(x.shape, w.shape, groups, False)
    out = _conv_out_sizes(x.shape, w.shape, stride, pads, dilation)
    return [spec((x.shape[0], w.shape[0], *out), dtypes.float16)]


_conv_fp8_kernel = pow2scaled_kernel(_conv_kernel)


def _conv_cost(ins, outs, attrs) -> Cost:
    per_out = 1
    for d in ins[1].shape[1:]:
        per_out *= d
    return Cost(2 * outs[0].nelms * per_out, sum(s.nbytes for s in (*ins, *outs)))


def conv_pow2scaled(
    t: Tensor,
    weight: Tensor,
    log2_scale,
    stride=(1, 1),
    padding=(0, 0, 0, 0),
    dilation=(1, 1),
    groups: int = 1,
    pad_type: str = "not_set",
    available_memory_proportions=None,
    partials_types=None,
    enable_conv_dithering=None,
) -> Tensor:
    """``conv(t, weight) * 2**log2_scale`` of float8 operands, as float16 (`ops.conv`'s
    arguments)."""
    _, stride, pads, dilation = _public_params(
        "conv_pow2scaled", t, weight, stride, padding, dilation, pad_type
    )
    pads = sp.auto_pads(pad_type, t.shape[2:], weight.shape[2:], stride, dilation, pads)
    s = _scale_tensor(log2_scale, "conv_pow2scaled")
    attrs = _attrs(stride, pads, dilation, int(groups))
    return create_op(CONV_FP8, [t, weight, s], attrs, out_names=["conv_out"])[0]


def _conv_samples():
    x = rand(2, 3, 5, 5, low=-2, high=2, seed=520).astype("float16")
    w = rand(4, 3, 3, 3, low=-2, high=2, seed=521).astype("float16")

    def build(a, b, sc):
        f = dtypes.float8_143
        return conv_pow2scaled(
            pow2scale_cast_to_fp8(a, 0, f), pow2scale_cast_to_fp8(b, 0, f), sc, padding=(1, 1, 1, 1)
        )

    def ref(a, b, _sc):
        f = dtypes.float8_143
        y = torch.nn.functional.conv2d(_fp8_of(a, f, 0), _fp8_of(b, f, 0), padding=1)
        return (y * 2.0**-1).half()

    return [
        Sample(
            [x, w, torch.tensor(-1, dtype=torch.int32).numpy()],
            build,
            ref,
            grad=False,
            rtol=0,
            atol=0,
            name="f143",
        )
    ]


CONV_FP8 = register(
    OpDef(
        "ConvPow2Scaled",
        _conv_infer,
        _conv_fp8_kernel,
        cost=_conv_cost,
        samples=_conv_samples,
        fp16_in_fp32=False,
        session_options=_OPTION,
        popxl_type="Conv",
    )
)
