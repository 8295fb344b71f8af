"""`DotTree`: a tree of named leaves addressed by dotted keys (``"fc1.weight"``, ``t[0]``)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

from .utils import OrderedDict

__all__ = ["DotTree", "check_key", "sanitise", "to_mapping"]

T = TypeVar("T")
Key = str | int
_Tree = TypeVar("_Tree", bound="DotTree")  # a subclass's methods return the subclass


def sanitise(name: str) -> str:
    """``name`` as a valid key component: non-word characters become ``_``, and a leading
    digit gets a ``_`` in front.

    >>> sanitise("layer-1/w")
    'layer_1_w'
    """
    return re.sub(r"\W|^(?=\d)", "_", name)


def _component(part: str, key: Key) -> str:
    """One validated path component; numeric components are normalised (``"01"`` -> ``"1"``)."""
    if part.isidentifier():
        return part
    if part.isnumeric():
        try:
            return str(int(part))
        except ValueError:
            pass
    raise ValueError(
        f"Invalid DotTree key {key!r}: component {part!r} must be a python identifier or a "
        "non-negative integer (components are separated by '.')."
    )


def check_key(key: object) -> None:
    """Raise ValueError/TypeError if ``key`` is not a valid (dotted) DotTree key."""
    _split(key)


def _split(key: object) -> list[str]:
    """A key as its validated list of components."""
    if isinstance(key, bool) or not isinstance(key, (str, int)):
        raise TypeError(f"DotTree keys must be str or int, got {type(key).__name__} {key!r}.")
    if isinstance(key, int):
        if key < 0:
            raise ValueError(f"Invalid DotTree key {key}: integer keys must be >= 0.")
        return [str(key)]
    return [_component(p, key) for p in key.split(".")]


class DotTree(Generic[T]):
    """An insertion-ordered tree of leaves; sub-trees are DotTrees of the same class.

    Keys are python identifiers or non-negative integers; a dotted string walks sub-trees.

    >>> t = DotTree.from_dict({"a.b": 1, "a.c": 2, "d": 3})
    >>> t.a.c, t["a.b"], t.keys_flat()
    (2, 1, ['a.b', 'a.c', 'd'])
    """

    def __init__(self, **kwargs: Any) -> None:
        self._map: OrderedDict[str, Any] = OrderedDict()
        for k, v in kwargs.items():
            self.insert(k, v)

    # access ---------------------------------------------------------------------------
    def _resolve(self, key: Key) -> tuple[DotTree, str]:
        """The sub-tree holding ``key`` and the final component (KeyError if a step is missing)."""
        if isinstance(key, int) and not isinstance(key, bool) and key < 0:
            return self, self._negative(key)
        parts = _split(key)
        node: DotTree = self
        for i, part in enumerate(parts[:-1]):
            child = node._map.get(part)
            if not isinstance(child, DotTree):
                where = ".".join(parts[: i + 1])
                raise KeyError(
                    f"{key!r}: {where!r} is not a sub-tree (available keys: {node.keys()})"
                    if child is not None
                    else f"{key!r}: no key {where!r} (available keys: {node.keys()})"
                )
            node = child
        return node, parts[-1]

    def _negative(self, key: int) -> str:
        """A negative int key counted back from the largest numeric key + 1."""
        numeric = [int(k) for k in self._map if k.isnumeric()]
        if not numeric:
            raise KeyError(f"Negative key {key}: this tree has no integer keys ({self.keys()}).")
        resolved = max(numeric) + 1 + key
        if resolved < 0:
            raise KeyError(
                f"Negative key {key} is out of range (largest integer key {max(numeric)})."
            )
        return str(resolved)

    def get(self, key: Key) -> Any:
        """The leaf or sub-tree at ``key`` (int, identifier or dotted path)."""
        node, last = self._resolve(key)
        try:
            return node._map[last]
        except KeyError:
            raise KeyError(
                f"No key {key!r} in {type(self).__name__} (available keys: {node.keys()})."
            ) from None

    def __getitem__(self, key: Key) -> Any:
        return self.get(key)

    def __getattr__(self, key: str) -> Any:
        # Only reached when normal lookup fails; "_map" may be missing during unpickling/copy.
        if "_map" not in self.__dict__:
            raise AttributeError(key)
        try:
            return self.get(key)
        except (KeyError, ValueError):
            raise AttributeError(
                f"{type(self).__name__!r} object has no attribute or key "
                f"{key!r}. Available keys: {self.keys()}"
            ) from None

    def __contains__(self, key: Key) -> bool:
        try:
            self.get(key)
        except (KeyError, ValueError, TypeError):
            return False
        return True

    __iter__ = None  # iterate keys(), values() or to_dict() explicitly

    # mutation ---------------------------------------------------------------------------
    def insert(self, key: Key, value: Any, overwrite: bool = False) -> None:
        """Add ``value`` at ``key``; ValueError if it exists and ``overwrite`` is False.

        As in popxl.addons, a dotted insert into an existing top-level key also needs
        ``overwrite=True`` (then it merges into that sub-tree). A dotted insert builds a copy
        of the sub-tree and swaps it in, so a failed insert leaves the tree unchanged. With
        ``overwrite=True`` a tree inserted over a tree merges.
        """
        parts = _split(key)
        head = parts[0]
        if len(parts) > 1:
            existing = self._map.get(head)
            if existing is not None and not isinstance(existing, DotTree):
                raise ValueError(f"Cannot insert {key!r}: {head!r} is a leaf, not a sub-tree.")
            if existing is not None and not overwrite:
                raise ValueError(
                    f"Cannot insert {key!r}: key {head!r} already exists in "
                    f"{type(self).__name__}. Use overwrite=True to merge into it."
                )
            sub = existing.copy() if existing is not None else type(self)()
            sub.insert(".".join(parts[1:]), value, overwrite)
            self._map[head] = sub
            return
        if head in self._map:
            if not overwrite:
                raise ValueError(
                    f"Key {key!r} already exists in {type(self).__name__}. "
                    "Use overwrite=True to replace it."
                )
            current = self._map[head]
            if isinstance(current, DotTree) and isinstance(value, DotTree):
                merged = current.copy()
                merged.update(value, overwrite=True)
                value = merged
        self._map[head] = value

    def _insert_in_place(self, key: Key, value: Any, overwrite: bool = False) -> None:
        """`insert` that adds to the existing sub-trees instead of swapping in copies of them.

        A dotted `insert` copies the sub-tree it goes into, so n inserts under one prefix
        cost O(n^2); this one is O(depth). Only for a tree whose sub-trees no other tree
        holds (its owner sees the same result; a holder of a sub-tree would see the new
        leaf). Any case that `insert` would refuse or merge goes through `insert`.
        """
        parts = _split(key)
        node: DotTree = self
        for part in parts[:-1]:
            child = node._map.get(part)
            if child is None:
                break
            if not isinstance(child, DotTree) or not overwrite:
                return self.insert(key, value, overwrite)  # raises as insert does
            node = child
        else:
            if parts[-1] in node._map:
                return self.insert(key, value, overwrite)  # replace or merge as insert does
        depth = 0
        node = self
        while depth < len(parts) - 1 and parts[depth] in node._map:
            node, depth = node._map[parts[depth]], depth + 1
        for part in parts[depth:-1]:
            node._map[part] = node = type(self)()
        node._map[parts[-1]] = value

    def update(self, other: DotTree, overwrite: bool = False) -> None:
        """Insert every top-level item of (a copy of) ``other``."""
        if not isinstance(other, DotTree):
            raise TypeError(f"update expects a DotTree, got {type(other).__name__}.")
        for k, v in other.copy()._map.items():
            self.insert(k, v, overwrite)

    def pop(self, key: Key) -> Any:
        """Remove and return the leaf or sub-tree at ``key``."""
        node, last = self._resolve(key)
        if last not in node._map:
            raise KeyError(
                f"No key {key!r} in {type(self).__name__} (available keys: {node.keys()})."
            )
        return node._map.pop(last)

    def _set(self, key: str, value: Any) -> None:
        """Put ``value`` at top-level ``key`` as is (keeps its position if the key exists)."""
        self._map[_split(key)[0]] = value

    def _clear(self) -> None:
        """Remove every leaf, keeping (now empty) sub-tree objects in place."""
        for k, v in list(self._map.items()):
            if isinstance(v, DotTree):
                v._clear()
            else:
                del self._map[k]

    def __bool__(self) -> bool:
        # popxl.addons' trees are always truthy, even when empty (`assert tree.sub` after
        # `_clear()` holds there); len() still counts the top-level keys.
        return True

    def len(self) -> int:
        """The number of top-level keys (popxl.addons' spelling of ``len(tree)``)."""
        return len(self._map)

    # copies and views ------------------------------------------------------------------
    def copy(self: _Tree) -> _Tree:
        """A new tree: sub-trees are copied, leaves are shared."""
        new = type(self)()
        for k, v in self._map.items():
            new._map[k] = v.copy() if isinstance(v, DotTree) else v
        return new

    def filter_keys(self: _Tree, keys: Iterable[Key]) -> _Tree:
        """A new tree with only ``keys`` (dotted keys allowed, several under one sub-tree:
        ``["head.a", "head.b"]``); ValueError on duplicates."""
        keys = list(keys)
        if len({str(k) for k in keys}) != len(keys):
            raise ValueError(f"filter_keys: duplicate keys in {keys}.")
        new = type(self)()
        for k in keys:
            v = self.get(k)
            # merging: two keys may share a sub-tree
            new.insert(k, v.copy() if isinstance(v, DotTree) else v, overwrite=True)
        return new

    def map(self: _Tree, fn: Callable[[Any], Any]) -> _Tree:
        """A tree of the same shape with ``fn(leaf)`` at every leaf."""
        new = type(self)()
        for k, v in self._map.items():
            new._map[k] = v.map(fn) if isinstance(v, DotTree) else fn(v)
        return new

    def keys(self) -> list[str]:
        """Top-level keys, in insertion order."""
        return list(self._map.keys())

    def values(self) -> list[Any]:
        """Top-level values (leaves and sub-trees), in insertion order."""
        return list(self._map.values())

    def items(self) -> list[tuple[str, Any]]:
        return list(self._map.items())

    def __len__(self) -> int:
        return len(self._map)

    def to_dict(self) -> dict[str, T]:
        """Flattened ``{dotted key: leaf}`` in insertion (depth-first) order."""
        out: dict[str, T] = {}
        for k, v in self._map.items():
            if isinstance(v, DotTree):
                out.update({f"{k}.{sk}": sv for sk, sv in v.to_dict().items()})
            else:
                out[k] = v
        return out

    def keys_flat(self) -> list[str]:
        return list(self.to_dict().keys())

    def values_flat(self) -> list[T]:
        return list(self.to_dict().values())

    def len_flat(self) -> int:
        return len(self.to_dict())

    @classmethod
    def from_dict(cls: type[_Tree], d: Mapping[Any, Any]) -> _Tree:
        """A nested tree from a flat mapping of dotted (or int) keys."""
        tree = cls()
        # Without tree values, every sub-tree is made here and held by nobody else, so the
        # inserts need not copy them (which costs O(n^2) for n keys under one prefix).
        insert = (
            tree.insert
            if any(isinstance(v, DotTree) for v in d.values())
            else tree._insert_in_place
        )
        for k, v in d.items():
            insert(k, v, overwrite=True)  # merges "a.b" and "a.c" into one sub-tree
        return tree

    def unpack(self) -> tuple[tuple[str, ...], tuple[T, ...]]:
        """``(keys, leaves)`` of the flattened tree, sorted by key."""
        items = sorted(self.to_dict().items(), key=lambda kv: kv[0])
        if not items:
            return [], []  # type: ignore[return-value]
        keys, values = zip(*items)
        return keys, values

    @classmethod
    def pack(cls: type[_Tree], keys: Iterable[Key], values: Iterable[Any]) -> _Tree:
        """The inverse of `unpack`: a tree from parallel sequences of keys and leaves."""
        keys, values = list(keys), list(values)
        if len(keys) != len(values):
            raise ValueError(f"pack: {len(keys)} keys but {len(values)} values.")
        return cls.from_dict(dict(zip(keys, values)))

    def to_mapping(self, other: DotTree) -> dict[Any, Any]:
        """``{self leaf: other leaf}`` for every flattened key both trees have."""
        return to_mapping(self, other)

    sanitise = staticmethod(sanitise)

    def __repr__(self) -> str:
        # The seeds' printed output shows the flattened dict in python's dict format.
        return repr(self.to_dict())


def to_mapping(a: DotTree, b: DotTree) -> dict[Any, Any]:
    """``{a leaf: b leaf}`` over the flattened keys common to ``a`` and ``b`` (``a``'s order)."""
    bd = b.to_dict()
    return {v: bd[k] for k, v in a.to_dict().items() if k in bd}
