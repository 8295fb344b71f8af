"""Random ops: dropout, random_uniform, random_normal, split_random_seed.

Every random op takes a seed tensor (uint32, shape (2,), see `popxl_core.random_seed`) and
is a pure function of it: the same seed gives the same numbers. The numbers come from a
torch CPU generator seeded by `generator_from_seed`. The gradient of dropout is dropout of
the incoming gradient with the same seed, so the backward pass regenerates exactly the
forward mask instead of storing it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .. import dtypes
from ..tensor import Tensor, TensorSpec, constant
from ._utils import rand, spec
from .registry import OpDef, Sample, create_op, register

__all__ = ["dropout", "random_normal", "random_uniform", "shaped_dropout", "split_random_seed"]

_MASK64 = (1 << 64) - 1
_FLOAT_DTYPES = ("float16", "float32")


def _splitmix64(x: int) -> int:
    """A bijective 64-bit mixer: nearby seeds give unrelated generator states."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _seed_words(seed: torch.Tensor) -> tuple[int, int]:
    hi, lo = (int(w) for w in seed.reshape(-1).tolist())
    return hi, lo


def generator_from_seed(seed: torch.Tensor) -> torch.Generator:
    """The torch generator of a seed tensor (uint32 words ``[high, low]``).

    torch's CPU generator keeps only the low 32 bits of its seed, so both words are mixed
    into those 32 bits first.
    """
    hi, lo = _seed_words(seed)
    mixed = _splitmix64((hi << 32) | lo)
    return torch.Generator().manual_seed((mixed >> 32) ^ (mixed & 0xFFFFFFFF))


def _check_seed(s: TensorSpec) -> None:
    if s.dtype is not dtypes.uint32:
        raise TypeError(
            f"the seed tensor must be uint32, got {s.dtype.name} (make one with popxl.create_seeds)"
        )
    if tuple(s.shape) != (2,):
        raise ValueError(
            f"the seed tensor must have shape (2,), got {tuple(s.shape)} "
            "(make one with popxl.create_seeds)"
        )


def _check_float(s: TensorSpec, what: str) -> None:
    if s.dtype.name not in _FLOAT_DTYPES:
        raise TypeError(f"{what} must be float16 or float32, got {s.dtype.name}")


def _seed_samples_input(k: int) -> np.ndarray:
    return np.random.default_rng(1000 + k).integers(0, 2**32, size=2).astype(np.uint32)


# Dropout and ShapedDropout ------------------------------------------------------------------
def _keep_mask(seed: torch.Tensor, shape: Sequence[int], ratio: float) -> torch.Tensor:
    """float32 mask, 1 where an element is kept; uniform draws >= ratio are kept."""
    draws = torch.rand(tuple(shape), generator=generator_from_seed(seed))
    return (draws >= ratio).to(torch.float32)


def _dropout_infer(ins, ratio, shape=None):
    _check_float(ins[0], "the dropout input")
    _check_seed(ins[1])
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"the dropout probability must be in [0, 1), got {ratio}")
    if shape is not None:
        _check_mask_shape(ins[0].shape, shape)
    return [ins[0]]


def _check_mask_shape(shape, mask_shape) -> None:
    try:
        out = tuple(np.broadcast_shapes(tuple(mask_shape), tuple(shape)))
    except ValueError:
        out = None
    if out != tuple(shape):
        raise ValueError(
            f"the dropout shape {tuple(mask_shape)} does not broadcast to the "
            f"input shape {tuple(shape)}"
        )


def _dropout_kernel(t, seed, ratio, shape=None):
    mask = _keep_mask(seed, t.shape if shape is None else shape, ratio)
    return (t * mask * (1.0 / (1.0 - ratio))).to(t.dtype)


def _dropout_grad(ctx):
    # Same op, same seed: the gradient is masked and scaled exactly like the forward.
    dy = ctx.grad_output(0)
    return [create_op(ctx.op.opdef, [dy, ctx.input(1)], dict(ctx.attrs))[0], None]


def _dropout_reference(ratio, shape=None):
    def ref(t, seed):
        mask = _keep_mask(seed, t.shape if shape is None else shape, ratio)
        return t * mask * (1.0 / (1.0 - ratio))

    return ref


def _dropout_samples():
    x = rand(4, 6, seed=11)
    return [
        Sample(
            [x, _seed_samples_input(0)], lambda t, s: dropout(t, s, 0.3), _dropout_reference(0.3)
        ),
        Sample(
            [rand(2, 3, 5, seed=12), _seed_samples_input(1)],
            lambda t, s: dropout(t, s, 0.5),
            _dropout_reference(0.5),
            name="rank3",
        ),
        Sample(
            [x, _seed_samples_input(2)],
            lambda t, s: dropout(t, s, 0.0),
            _dropout_reference(0.0),
            name="p0",
        ),
    ]


def _shaped_dropout_samples():
    return [
        Sample(
            [rand(3, 4, 5, seed=13), _seed_samples_input(3)],
            lambda t, s: shaped_dropout(t, s, [3, 1, 5], 0.4),
            _dropout_reference(0.4, (3, 1, 5)),
        ),
        Sample(
            [rand(3, 4, seed=14), _seed_samples_input(4)],
            lambda t, s: shaped_dropout(t, s, [4], 0.5),
            _dropout_reference(0.5, (4,)),
            name="rank1_mask",
        ),
    ]


DROPOUT = register(
    OpDef(
        "Dropout",
        _dropout_infer,
        _dropout_kernel,
        grad=_dropout_grad,
        samples=_dropout_samples,
        out_name="dropout_out",
    )
)
SHAPED_DROPOUT = register(
    OpDef(
        "ShapedDropout",
        _dropout_infer,
        _dropout_kernel,
        grad=_dropout_grad,
        samples=_shaped_dropout_samples,
        out_name="shaped_dropout_out",
    )
)


def dropout(t: Tensor, seed_tensor: Tensor, p: float) -> Tensor:
    """Zero each element with probability ``p`` and scale the rest by 1/(1-p)."""
    return create_op(DROPOUT, [t, seed_tensor], {"ratio": float(p)})[0]


def shaped_dropout(t: Tensor, seed_tensor: Tensor, shape: Sequence[int], ratio: float) -> Tensor:
    """Dropout with one mask of ``shape``, broadcast over ``t`` (e.g. whole channels)."""
    mask_shape = tuple(int(s) for s in shape)
    return create_op(
        SHAPED_DROPOUT, [t, seed_tensor], {"ratio": float(ratio), "shape": mask_shape}
    )[0]


# RandomUniform and RandomNormal -------------------------------------------------------------
def _random_infer(ins, shape, dtype, **params):
    _check_seed(ins[0])
    if dtype.name not in _FLOAT_DTYPES:
        raise TypeError(f"random values must be float16 or float32, got {dtype.name}")
    if any(d < 0 for d in shape):
        raise ValueError(f"negative dimension in shape {shape}")
    return [spec(shape, dtype)]


def _uniform_kernel(seed, shape, dtype, low, high):
    draws = torch.rand(shape, generator=generator_from_seed(seed))
    return (draws * (high - low) + low).to(dtype.as_torch())


def _normal_kernel(seed, shape, dtype, mean, std):
    draws = torch.randn(shape, generator=generator_from_seed(seed))
    return (draws * std + mean).to(dtype.as_torch())


def _uniform_samples():
    def ref(seed):
        return torch.rand((40, 30), generator=generator_from_seed(seed)) * 4.0 - 1.0

    return [Sample([_seed_samples_input(5)], lambda s: random_uniform(s, (40, 30), -1.0, 3.0), ref)]


def _normal_samples():
    def ref(seed):
        return torch.randn((50, 20), generator=generator_from_seed(seed)) * 0.5 + 2.0

    return [Sample([_seed_samples_input(6)], lambda s: random_normal(s, (50, 20), 2.0, 0.5), ref)]


RANDOM_UNIFORM = register(
    OpDef(
        "RandomUniform",
        _random_infer,
        _uniform_kernel,
        samples=_uniform_samples,
        out_name="random_uniform_out",
    )
)
RANDOM_NORMAL = register(
    OpDef(
        "RandomNormal",
        _random_infer,
        _normal_kernel,
        samples=_normal_samples,
        out_name="random_normal_out",
    )
)


def _shape_attr(shape) -> tuple[int, ...]:
    return (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)


def random_uniform(
    seed_tensor: Tensor,
    shape: Sequence[int],
    low: float = 0.0,
    high: float = 1.0,
    dtype: dtypes.dtype = dtypes.float32,
) -> Tensor:
    """Uniform random values in ``[low, high)``, a function of the seed."""
    attrs = {"shape": _shape_attr(shape), "dtype": dtype, "low": float(low), "high": float(high)}
    return create_op(RANDOM_UNIFORM, [seed_tensor], attrs)[0]


def random_normal(
    seed_tensor: Tensor,
    shape: Sequence[int],
    mean: float = 0.0,
    std: float = 1.0,
    dtype: dtypes.dtype = dtypes.float32,
) -> Tensor:
    """Normally distributed random values, a function of the seed."""
    attrs = {"shape": _shape_attr(shape), "dtype": dtype, "mean": float(mean), "std": float(std)}
    return create_op(RANDOM_NORMAL, [seed_tensor], attrs)[0]


# ModifyRandomSeed ---------------------------------------------------------------------------
def _modify_seed_infer(ins):
    _check_seed(ins[0])
    if ins[1].dtype is not dtypes.uint32 or ins[1].nelms != 1:
        raise TypeError(
            f"the seed modifier must be a uint32 scalar, got {ins[1].dtype.name} "
            f"{tuple(ins[1].shape)}"
        )
    return [ins[0]]


def derive_seed(seed: torch.Tensor, modifier: int) -> torch.Tensor:
    """A new seed from ``seed`` and ``modifier``: unrelated streams for distinct modifiers."""
    hi, lo = _seed_words(seed)
    mixed = _splitmix64(((hi << 32) | lo) ^ _splitmix64(int(modifier)))
    return torch.tensor([mixed >> 32, mixed & 0xFFFFFFFF], dtype=torch.uint32)


def _modify_seed_kernel(seed, modifier):
    return derive_seed(seed, int(modifier.reshape(-1)[0]))


def _modify_seed_samples():
    def build(s):
        return split_random_seed(s, 3)

    def ref(seed):
        return tuple(derive_seed(seed, i) for i in range(3))

    return [Sample([_seed_samples_input(7)], build, ref, rtol=0, atol=0)]


MODIFY_RANDOM_SEED = register(
    OpDef(
        "ModifyRandomSeed",
        _modify_seed_infer,
        _modify_seed_kernel,
        samples=_modify_seed_samples,
        out_name="modified_seed",
    )
)


def split_random_seed(seed: Tensor, n: int = 2) -> tuple[Tensor, ...]:
    """``n`` new seeds derived from ``seed`` (one ModifyRandomSeed op each)."""
    if int(n) < 1:
        raise ValueError(f"split_random_seed: n must be >= 1, got {n}.")
    return tuple(
        create_op(MODIFY_RANDOM_SEED, [seed, constant(i, dtypes.uint32)])[0] for i in range(int(n))
    )
