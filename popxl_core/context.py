"""The global building context: graph stack, name scopes, placement and `in_sequence`."""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Set

if TYPE_CHECKING:  # pragma: no cover
    from .graph import Graph, Op
    from .ir import Ir

__all__ = [
    "Context",
    "get_current_context",
    "get_current_graph",
    "gcg",
    "get_main_graph",
    "gmg",
    "get_ir",
    "gir",
    "in_sequence",
    "name_scope",
    "ipu",
    "io_tiles",
    "module_origin",
    "op_debug_context",
    "debug_context_frame_offset",
    "ops_created",
]


class _SequenceFrame:
    """One `in_sequence` block: its mode and, per graph, the ops new ops must follow."""

    def __init__(self, mode):
        self.mode = mode
        self.before: Dict[int, Set["Op"]] = {}
        self.created: Dict[int, List["Op"]] = {}


class Context:
    """Holds the graph stack and the settings that new ops pick up."""

    def __init__(self) -> None:
        self.graphs: List["Graph"] = []
        self.name_scopes: List[str] = []
        self.ipu_id: int = 0
        self.io_tile_set: bool = False
        self.module_path: Optional[str] = None  # see `module_origin`
        self._frames: List[_SequenceFrame] = []
        self._hooks: Dict[int, Callable[["Op"], None]] = {}
        self._next_hook = 0

    @property
    def graph(self) -> "Graph":
        if not self.graphs:
            raise RuntimeError(
                "Trying to access a graph, but no graph has been selected. "
                "Use `with ir.main_graph:` or build inside `ir.create_graph`."
            )
        return self.graphs[-1]

    def push_graph(self, g: "Graph") -> None:
        if self.graphs and self.graphs[0].ir is not g.ir:
            # PopXL refuses this too: ops built here would mix tensors of two Irs
            raise RuntimeError(
                f"Cannot enter {g!r} of {g.ir!r} inside a graph context of "
                f"{self.graphs[0].ir!r}: nested graph contexts must belong to one Ir. Leave "
                "the outer `with` first (build each Ir in its own block)."
            )
        self.graphs.append(g)

    def pop_graph(self, g: "Graph") -> None:
        if not self.graphs or self.graphs[-1] is not g:
            raise RuntimeError(f"Graph context stack corrupted while leaving {g!r}.")
        self.graphs.pop()

    # hooks ------------------------------------------------------------
    def register_op_created_hook(self, fn: Callable[["Op"], None]) -> int:
        self._next_hook += 1
        self._hooks[self._next_hook] = fn
        return self._next_hook

    def remove_op_created_hook(self, handle: int) -> None:
        self._hooks.pop(handle, None)

    # in_sequence --------------------------------------------------------
    def _push_sequence(self, mode) -> None:
        self._frames.append(_SequenceFrame(mode))

    def _pop_sequence(self) -> None:
        frame = self._frames.pop()
        if not self._frames or frame.mode == "pass":
            return
        parent = self._frames[-1]
        for key, created in frame.created.items():
            if parent.mode is True and created:
                # the block as a whole stays ordered before later ops of the parent
                parent.before[key] = set(created) if frame.mode is False else {created[-1]}
            parent.created.setdefault(key, []).extend(created)

    def _before(self, key: int) -> Set["Op"]:
        for frame in reversed(self._frames):
            if key in frame.before:
                return frame.before[key]
        return set()

    def op_created(self, op: "Op") -> None:
        """Called by the op factory for every new op: topocons, then hooks."""
        if self._frames and self._frames[-1].mode in (True, False):
            frame, key = self._frames[-1], id(op.graph)
            for b in self._before(key):
                op.graph._add_topocon(b, op)
            frame.created.setdefault(key, []).append(op)
            if frame.mode is True:
                frame.before[key] = {op}
            else:
                frame.before.setdefault(key, set(self._before(key)))
        for fn in list(self._hooks.values()):
            fn(op)


_CONTEXT = Context()


def get_current_context() -> Context:
    return _CONTEXT


def get_current_graph() -> "Graph":
    """The graph new ops go into (top of the graph stack)."""
    return _CONTEXT.graph


def get_main_graph() -> "Graph":
    return get_current_graph().main_graph


def get_ir() -> "Ir":
    return get_current_graph().ir


gcg = get_current_graph
gmg = get_main_graph
gir = get_ir


class in_sequence:
    """Order ops in creation order (`True`), leave them free (`False`) or add nothing ('pass').

    Works as a context manager and as a decorator: ``@popxl.in_sequence()``.
    """

    def __init__(self, enabled=True) -> None:
        if enabled is None:
            raise TypeError("in_sequence(None) is not allowed: use True, False or 'pass'.")
        if enabled not in (True, False, "pass"):
            raise TypeError(f"in_sequence expects True, False or 'pass', got {enabled!r}.")
        self.enabled = enabled

    def __enter__(self):
        _CONTEXT._push_sequence(self.enabled)
        return self

    def __exit__(self, *exc) -> None:
        _CONTEXT._pop_sequence()

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with in_sequence(self.enabled):
                return fn(*args, **kwargs)

        return wrapper


@contextlib.contextmanager
def name_scope(name: str):
    """Prefix the names of tensors and ops created inside with ``name/``."""
    _CONTEXT.name_scopes.append(name)
    try:
        yield
    finally:
        _CONTEXT.name_scopes.pop()


@contextlib.contextmanager
def ipu(ipu: int):
    """Place ops created inside on virtual IPU ``ipu``."""
    if not isinstance(ipu, int) or ipu < 0:
        raise ValueError(f"popxl.ipu expects a non-negative int, got {ipu!r}.")
    prev, _CONTEXT.ipu_id = _CONTEXT.ipu_id, ipu
    try:
        yield
    finally:
        _CONTEXT.ipu_id = prev


@contextlib.contextmanager
def io_tiles():
    """Place ops created inside on the IO tile set."""
    prev, _CONTEXT.io_tile_set = _CONTEXT.io_tile_set, True
    try:
        yield
    finally:
        _CONTEXT.io_tile_set = prev


@contextlib.contextmanager
def module_origin(path: str):
    """Tag ops created inside with the torch module ``path`` they were lowered from.

    Not a PopXL name: frontends (popxl_fx) use it so that the simulator's reports and
    out-of-memory errors can name the user's module beside each op.
    """
    prev, _CONTEXT.module_path = _CONTEXT.module_path, path
    try:
        yield
    finally:
        _CONTEXT.module_path = prev


def op_debug_context(fn):
    """Decorator kept for API parity: popxl uses it to attach debug info to ops."""
    return fn


def debug_context_frame_offset(offset: int):
    """Decorator factory kept for API parity (debug-info frame offsets)."""

    def deco(fn):
        return fn

    return deco


@contextlib.contextmanager
def ops_created():
    """Collect the ops created inside the block into the yielded list (in creation order); the
    list is complete once the block has left (transforms that act on what a block built)."""
    created: List["Op"] = []
    ctx = get_current_context()
    handle = ctx.register_op_created_hook(created.append)
    try:
        yield created
    finally:
        ctx.remove_op_created_hook(handle)
