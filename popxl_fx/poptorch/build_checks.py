"""PopTorch's checks around building an executor's program, and its error type for what
popxl_fx's capture cannot lower.

PopTorch raises `poptorch.Error` when the model's forward removes one of its buffers, and for
what it cannot trace; popxl_fx's capture reports the latter as an `UnsupportedError` with one
`Issue` each, which becomes a `poptorch.Error` leading with each issue's own words.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from popxl_fx.errors import UnsupportedError
from popxl_fx.inplace import mutated_input, written_chain

from .errors import Error

__all__ = ["check_broadcast_buffers", "check_updatable_buffers", "checked_build"]

BROADCAST_BUFFERS = (
    "PopTorch does not support broadcasting buffers. If your model is able to tolerate "
    "buffers becoming out of sync between replicas, you can disable buffer broadcasting "
    "using poptorch.Options.broadcastBuffers(False)."
)


def checked_build(build: Callable[[], None], model: nn.Module) -> None:
    """Run ``build`` (which traces ``model``'s forward) with PopTorch's checks."""
    before = [name for name, _ in model.named_buffers()]
    try:
        build()
    except UnsupportedError as err:
        if err.issues and all(i.kind == "data-dependent shape" for i in err.issues):
            raise  # `errors.eager_errors` raises what PopTorch's fake-tensor trace raises
        raise Error(_summary(err)) from err
    after = {name for name, _ in model.named_buffers()}
    for name in before:
        if name not in after:
            raise Error(f"Buffer {name} is removed from the model when calling the forward method.")


def _summary(err: UnsupportedError) -> str:
    """Each issue's what and hint on one line, then popxl_fx's full report."""
    lines = [f"{issue.what} {issue.hint}".strip() for issue in err.issues]
    return "\n".join([*lines, "", str(err)])


def check_updatable_buffers(names: list | None, model: nn.Module) -> None:
    """PopTorch's compile-time error for ``Options.updatableNamedBuffers`` naming a tensor
    that is not one of the model's buffers."""
    buffers = {name for name, _ in model.named_buffers()}
    for name in names or []:
        if name not in buffers:
            raise Error(
                f"updatableNamedBuffers: the model has no buffer named {name!r} "
                f"(its buffers: {sorted(buffers)})."
            )


def check_broadcast_buffers(options, fxm) -> None:
    """PopTorch's error for a forward that updates a buffer in place (``self.buf += x``)
    while replicas broadcast their buffers (``broadcastBuffers``, on by default): it cannot
    keep the replicas' buffers equal. ``fxm``: the built `popxl_fx.Module`."""
    if options.replication_factor <= 1 or not options.broadcast_buffers:
        return
    root = fxm.torch_module
    buffers = {name for name, _ in root.named_buffers()}
    for captured in fxm._captures.values():
        for node in captured.gm.graph.nodes:
            target = mutated_input(node, root)
            if target is not None and written_chain(target)[-1].target in buffers:
                raise Error(BROADCAST_BUFFERS)
