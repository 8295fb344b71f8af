"""Captures shared by the builds of one trainer signature (#38, #39).

``memory="auto"`` builds up to a dozen what-if programs and then the chosen one, all of the
same model on the same inputs. Each build makes its own `popxl_fx.Module`, whose captures
(torch.fx trace + the check trace) would otherwise be made again per build, and each phased
build splits the model into pieces (one more trace) and captures every piece. A
`SharedCaptures` held by those builds makes each of these once and hands the same objects to
every build that asks with the same key.

What a capture depends on is in the key: the traced module itself (by identity; the entry
keeps the module alive, so its id is never reused), the inputs' signature (shapes, dtypes,
every module's train mode: `module.signature`) and how the inputs reach ``forward``
(`calls.Binding`); a phased split adds the phase paths and the prefix. The options a build
differs by (outline, recompute, accumulation, weightless variables, rng, numerics) act on the
lowering, not on the trace: `capture.capture` takes none of them. A float16 build traces its
own half copy of the model (a new module, so a new key): it shares nothing.

The captures' example values stay real while the builds share them; each build forgets only
what it made itself (`Build.session`), and the owner forgets the shared ones once the last
build is made (`forget`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from .example_values import forget_examples

__all__ = ["SharedCaptures", "shared_or_made", "unshared"]

T = TypeVar("T")


class SharedCaptures:
    """Captures (and phased splits) made once per key, for every build that asks."""

    def __init__(self) -> None:
        # (id(owner), *key) -> (owner, value, the parts holding example values)
        self._held: dict[tuple, tuple[Any, Any, tuple]] = {}
        self.made = 0  # how many were made (the rest of the asks were shared)

    def get(self, key: tuple, owner: object, make: Callable[[], T], parts=lambda v: (v,)) -> T:
        """The value for ``owner`` and ``key``, made by ``make`` on the first ask;
        ``parts(value)``: what `forget` makes meta (a `Captured`, graph modules)."""
        full = (id(owner), *key)
        if full not in self._held:
            value = make()
            self._held[full] = (owner, value, tuple(parts(value)))
            self.made += 1
        return self._held[full][1]

    def holds(self, item: object) -> bool:
        """Whether ``item`` is (part of) a shared value: its owner forgets it, not a build."""
        return any(item is p for _, _, parts in self._held.values() for p in parts)

    def unshared(self, items: Iterable[Any]) -> list[Any]:
        """``items`` less the shared ones (what a build may forget itself)."""
        return [i for i in items if not self.holds(i)]

    def forget(self) -> None:
        """Every shared value's example tensors become meta tensors (the builds are made)."""
        forget_examples(*(p for _, _, parts in self._held.values() for p in parts))
        self._held.clear()


def shared_or_made(shared: SharedCaptures | None, key: tuple, owner: object, make: Callable):
    """``make()``, or the shared value for ``owner`` and ``key`` when ``shared`` is given."""
    return make() if shared is None else shared.get(key, owner, make)


def unshared(shared: SharedCaptures | None, items: Iterable[Any]) -> list[Any]:
    """``items`` less those ``shared`` holds: what a build may forget itself."""
    return list(items) if shared is None else shared.unshared(items)
