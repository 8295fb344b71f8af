"""Small utilities shared by the addons package."""

from __future__ import annotations

from typing import TypeVar

__all__ = ["OrderedDict"]

K = TypeVar("K")
V = TypeVar("V")


class OrderedDict(dict[K, V]):
    """A dict (insertion ordered) with positional access and popxl.addons' multi-line repr.

    >>> d = OrderedDict(a=1, b=2)
    >>> d.idx(1)
    ('b', 2)
    >>> print(d)
    {
    a: 1,
    b: 2,
    }
    """

    def idx(self, i: int) -> tuple[K, V]:
        """The ``(key, value)`` pair at position ``i`` (negative counts from the end)."""
        items = list(self.items())
        try:
            return items[i]
        except IndexError:
            raise IndexError(f"OrderedDict index {i} out of range for {len(items)} items") from None

    def __repr__(self) -> str:
        if not self:
            return "{}"
        return "{\n" + "".join(f"{k}: {v},\n" for k, v in self.items()) + "}"

    __str__ = __repr__
