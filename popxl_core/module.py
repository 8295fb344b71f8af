"""`popxl.Module`: a callable whose `build` is traced by `Ir.create_graph`."""

from __future__ import annotations

__all__ = ["Module"]


class Module:
    """Subclass and implement `build`; `ir.create_graph(module, ...)` traces it."""

    def __call__(self, *args, **kwargs):
        return self.build(*args, **kwargs)

    def build(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} must implement build().")
