"""Small utilities shared by the addons package (popxl.addons' ``utils``): `OrderedDict`,
`WeightsDict`, `timer`."""

from __future__ import annotations

import contextlib
import functools
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Optional, TypeVar

import numpy as np

from popxl_core import Tensor, dtype
from popxl_core.tensor import to_numpy

__all__ = ["OrderedDict", "WeightsDict", "git_commit", "host_value", "timer"]

K = TypeVar("K")
V = TypeVar("V")


class OrderedDict(dict[K, V]):
    """A dict (insertion ordered) with positional access and popxl.addons' multi-line repr.

    >>> d = OrderedDict(a=1, b=2)
    >>> d.idx(1)
    2
    >>> print(d)
    {
    a: 1,
    b: 2,
    }
    """

    def idx(self, i: int) -> V:
        """The value at position ``i`` (negative counts from the end), as popxl.addons'."""
        items = list(self.values())
        try:
            return items[i]
        except IndexError:
            raise IndexError(f"OrderedDict index {i} out of range for {len(items)} items") from None

    def __repr__(self) -> str:
        if not self:
            return "{}"
        return "{\n" + "".join(f"{k}: {v},\n" for k, v in self.items()) + "}"

    __str__ = __repr__


def _host_shape(var: Tensor) -> tuple[int, ...]:
    return tuple(getattr(var, "shape_on_host", var.shape))


class WeightsDict(OrderedDict):
    """A ``{Variable: np.ndarray}`` dict that rejects data of the wrong shape or dtype.

    Pass it to ``session.write_variables_data``.
    """

    def __init__(self, items: Any = (), **kwargs: Any) -> None:
        super().__init__()
        for k, v in dict(items, **kwargs).items():
            self[k] = v

    def __setitem__(self, var: Tensor, value: np.ndarray) -> None:
        value = np.asarray(value)
        if value.shape != _host_shape(var):
            raise ValueError(
                f"WeightsDict: data of shape {value.shape} for {var.id!r}, which "
                f"has host shape {_host_shape(var)}."
            )
        if value.dtype != var.dtype.as_numpy():
            raise TypeError(
                f"WeightsDict: data of dtype {value.dtype} for {var.id!r}, which "
                f"is {var.dtype.name}."
            )
        super().__setitem__(var, value)


def host_value(var: Tensor, data: Any, dt: dtype | None = None) -> np.ndarray:
    """``data`` (numpy or torch) as host data for ``var``: cast to ``dt`` (default the
    variable's dtype) and repeated over the replica groups of a grouped variable."""
    arr = to_numpy(data, dt or var.dtype)
    host = _host_shape(var)
    if arr.shape != host and host[1:] == arr.shape:
        arr = np.ascontiguousarray(np.broadcast_to(arr, host))
    return arr


@contextlib.contextmanager
def timer(title: Optional[str] = None, log_to_wandb: bool = True) -> Iterator[None]:
    """Time the block and log ``"<title> took N.NNNN s"`` at INFO level (logger
    ``popxl_addons``); with ``log_to_wandb``, also to wandb's active run when wandb is
    imported and a run is open (this project never imports or starts wandb itself).

    >>> with timer("nothing", log_to_wandb=False):
    ...     pass
    """
    start = time.perf_counter()
    yield
    seconds = time.perf_counter() - start
    logging.getLogger("popxl_addons").info(f"{title or 'timer'} took {seconds:.4f} s")
    wandb = sys.modules.get("wandb")
    if log_to_wandb and wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.log({f"timer/{title or 'timer'}": seconds}, commit=False)


@functools.cache
def git_commit() -> str:
    """The git commit of this project's checkout (popxl.addons' ``GIT_COMMIT``), or
    ``"unknown"`` outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"
