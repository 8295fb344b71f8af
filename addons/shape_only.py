"""The shape a variable factory's known samplers would give, read from their arguments.

In planning mode (`popxl_core.planning`) a factory needs only its data's shape and dtype. Most
factories are ``functools.partial`` of a numpy sampler or of a scipy.stats distribution's
``rvs`` with the size given; drawing them at POD sizes costs more host memory than the machine
has (BLOOM-176B's embedding shard: 112 M values through ``truncnorm.rvs``, 14 GB of
temporaries). For those the shape is their size argument, by those functions' documented
contract; anything else is drawn once as before.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import numpy as np

__all__ = ["known_shape"]

# numpy.random functions whose third positional argument is ``size``
_SIZE_THIRD = frozenset(
    {"normal", "uniform", "lognormal", "laplace", "logistic", "gumbel", "randint", "binomial"}
)
# numpy functions whose first argument is the shape of what they return
_SHAPE_FIRST = {np.zeros, np.ones, np.empty, np.full}


def known_shape(data_iter: Any) -> Optional[tuple[int, ...]]:
    """The shape ``data_iter()`` returns, when it is a partial of a sampler whose shape is
    its size (or shape) argument; None when it would have to be drawn to be known."""
    if not isinstance(data_iter, functools.partial):
        return None
    fn, args, kw = data_iter.func, data_iter.args, data_iter.keywords
    if fn in _SHAPE_FIRST:
        return _as_shape(args[0] if args else kw.get("shape"))
    if not _is_sampler(fn):
        return None
    if "size" in kw:
        return _as_shape(kw["size"])
    if getattr(fn, "__name__", "") in _SIZE_THIRD and len(args) >= 3:
        return _as_shape(args[2])
    return None


def _is_sampler(fn) -> bool:
    """A numpy.random function (module level or a RandomState / Generator method) or the
    ``rvs`` of a scipy.stats distribution."""
    owner = type(getattr(fn, "__self__", None)).__module__ or ""
    module = getattr(fn, "__module__", None) or ""
    if module.startswith("numpy.random") or owner.startswith("numpy.random"):
        return True
    return getattr(fn, "__name__", "") == "rvs" and owner.startswith("scipy.stats")


def _as_shape(size) -> Optional[tuple[int, ...]]:
    """``size`` as a shape: an int or a sequence of ints (None: one scalar, not known here)."""
    if isinstance(size, (int, np.integer)):
        return (int(size),)
    if isinstance(size, (tuple, list)) and all(isinstance(d, (int, np.integer)) for d in size):
        return tuple(int(d) for d in size)
    return None
