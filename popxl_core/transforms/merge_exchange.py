"""merge_exchange / io_tile_exchange: host and remote transfers made inside run as one exchange.

PopXL merges the HostLoad / HostStore / RemoteLoad / RemoteStore ops created inside the context
into one MultiExchange op. Here the ops stay as they are (so schedules print the same ops) and
are recorded as one merged exchange: the cost model charges its sync once. Merging changes
cost, never results; since the transfers of one exchange happen together, loading and storing
the same remote entry in one merged exchange has no defined order, which is an error here.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Iterator, List

from ..context import in_sequence, io_tiles, ops_created
from ..tensor import Constant

__all__ = ["merge_exchange", "io_tile_exchange", "exchange_group", "EXCHANGE_TYPES"]

EXCHANGE_TYPES = frozenset(
    {"HostLoad", "HostStore", "RemoteLoad", "RemoteLoadInplace", "RemoteStore"}
)
_GROUP_IDS = itertools.count(1)


def exchange_group(op) -> tuple[int, bool] | None:
    """(group id, whether ``op`` is the first op) of the merged exchange ``op`` belongs to;
    None for an op no `merge_exchange` merged."""
    return op.exchange_group


@contextlib.contextmanager
def merge_exchange() -> Iterator[None]:
    """Merge the host and remote transfers created inside into one exchange."""
    with ops_created() as created:
        yield
    _merge([op for op in created if op.type in EXCHANGE_TYPES])


def _merge(ops: List) -> None:
    _check_no_load_and_store_of_one_entry(ops)
    group = next(_GROUP_IDS)
    for i, op in enumerate(sorted(ops, key=lambda o: o.id)):
        op.exchange_group = (group, i == 0)


def _static_entry(op):
    """(buffer, entry) of a remote transfer with a constant offset; None otherwise."""
    off = op.inputs[-1]
    return (op.attrs["buffer"], int(off._data)) if isinstance(off, Constant) else None


def _check_no_load_and_store_of_one_entry(ops: List) -> None:
    loads = {_static_entry(op): op for op in ops if op.type.startswith("RemoteLoad")}
    loads.pop(None, None)
    for op in ops:
        key = _static_entry(op) if op.type == "RemoteStore" else None
        if key is not None and key in loads:
            buf, entry = key
            raise ValueError(
                f"merge_exchange: remote buffer {buf.remote_buffer_id} entry {entry} is both "
                f"loaded ({loads[(buf, entry)]!r}) and stored ({op!r}) in one merged "
                "exchange, whose transfers have no order. Store it in a separate exchange."
            )


@contextlib.contextmanager
def io_tile_exchange(verify_overlap: bool = True) -> Iterator[None]:
    """`io_tiles()` + `merge_exchange()` + `in_sequence(False)`: transfers on the IO tiles, as
    one exchange that can overlap compute.

    With ``verify_overlap`` a RuntimeError is raised if ops other than transfers (and the
    Init ops of their buffers) were created inside, since those would not overlap.
    """
    with ops_created() as created, io_tiles(), merge_exchange(), in_sequence(False):
        yield
    others = [op for op in created if op.type not in EXCHANGE_TYPES and op.type != "Init"]
    if verify_overlap and others:
        raise RuntimeError(
            "io_tile_exchange(verify_overlap=True): only host and remote transfers may be "
            f"created inside, found {', '.join(repr(op) for op in others)}."
        )
