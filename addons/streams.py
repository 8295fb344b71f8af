"""`InputStreams` / `OutputStreams`: named host streams as a DotTree (popxl.addons)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import popxl_core

from .dot_tree import DotTree

__all__ = ["InputStreams", "OutputStreams"]


class _Streams(DotTree):
    """Streams created from ``name=(shape, dtype)`` keyword arguments, in argument order.

    Indexing by position (``streams[0]``) and iteration follow that order, as in popxl.addons.
    """

    _new_stream: Any = None

    def __init__(self, **specs: tuple) -> None:
        super().__init__()
        for name, spec in specs.items():
            if not (isinstance(spec, tuple) and len(spec) == 2):
                raise TypeError(
                    f"{type(self).__name__}: {name}= must be a (shape, dtype) pair, got {spec!r}."
                )
            shape, dtype = spec
            self.insert(name, type(self)._new_stream(shape, dtype, name))

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, int) and not isinstance(key, bool):
            return self.values_flat()[key]
        return super().__getitem__(key)

    # DotTree turns iteration off (``__iter__ = None``); a stream tree iterates its streams,
    # as popxl.addons' does: an override the type checker cannot accept
    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        return iter(self.values_flat())


class InputStreams(_Streams):
    """Host-to-device streams: ``InputStreams(x=((1, 4), popxl.float32), ...)``."""

    _new_stream = staticmethod(popxl_core.h2d_stream)


class OutputStreams(_Streams):
    """Device-to-host streams: ``OutputStreams(y=((4,), popxl.int32), ...)``."""

    _new_stream = staticmethod(popxl_core.d2h_stream)
