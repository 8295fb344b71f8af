"""The module a PopTorch executor hands to popxl_fx: the user's model, with the training loss
chosen as PopTorch chooses it.

PopTorch's loss is the tensor marked with `poptorch.identity_loss` (the last one marked);
without a mark, the model's output when it is one tensor, else its last tensor output. The
wrapper returns ``(training loss, model output)``: popxl_fx trains on the first, a scalar
(a loss marked with ``reduction='none'`` is summed, the gradient of ones PopTorch starts
from), and the executor returns the second.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn

from popxl_fx.capture_watch import ruling, watching

from . import blocks, losses, marks
from .args import parser_for
from .custom_outputs import CustomOutputs
from .errors import Error
from .half import ParamsFollowActivations
from .plain_attrs import plain_constants
from .refused import check_refused
from .static_sizes import check_static_size

__all__ = ["Wrapped", "flat_call"]

_TENSOR = object()  # where a tensor goes in a call's template
_HALF_RULE = ParamsFollowActivations()


class _Custom:
    """A custom-typed argument in a template: its parser, the object, its tensor count."""

    def __init__(self, parser, value, count: int) -> None:
        self.parser, self.value, self.count = parser, value, count

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Custom) and (self.parser, self.count) == (
            other.parser,
            other.count,
        )

    # unhashable, as Python makes a class that defines __eq__ (the checker wants a method)
    __hash__ = None  # type: ignore[assignment]


def flat_call(args: tuple, kwargs: dict) -> tuple[list, tuple]:
    """The call's tensors in order, and its structure: (pytree spec, the leaves with each
    tensor replaced by a placeholder, custom-typed arguments by their `_Custom`)."""
    leaves, spec = pytree.tree_flatten((args, kwargs), is_leaf=lambda x: parser_for(x) is not None)
    tensors: list = []
    template: list[Any] = []
    for x in leaves:
        parser = parser_for(x)
        if parser is not None:
            held = list(parser.yieldTensors(x))
            tensors += held
            template.append(_Custom(parser, x, len(held)))
        elif isinstance(x, torch.Tensor):
            tensors.append(x)
            template.append(_TENSOR)
        else:
            template.append(x)
    return tensors, (spec, tuple(template))


def _leaf(x: Any, given) -> Any:
    if x is _TENSOR:
        return next(given)
    if isinstance(x, _Custom):
        return x.parser.reconstruct(x.value, iter([next(given) for _ in range(x.count)]))
    return x


class Wrapped(nn.Module):
    """``model`` run inside a `marks.recording`; ``training``: also pick the loss."""

    def __init__(
        self, model: nn.Module, training: bool, loss_factor: float = 1.0, rules: tuple = ()
    ) -> None:
        super().__init__()
        self.rules = (_HALF_RULE, *rules)  # `popxl_fx.capture_watch` rules of the trace
        self.model = model
        self.for_training = training
        self.loss_factor = loss_factor  # Sum reduction: micro-batches x replicas
        # The last forward's marks, changed in place: a trace puts back the plain attributes
        # a forward sets on a module, so `self.blocks = ...` would not outlive it.
        self.seen = marks.Marks()
        self.call: tuple | None = None  # `flat_call`'s structure of the calls compiled
        self.custom = CustomOutputs()  # the executor rebuilds custom-typed outputs with it

    @property
    def blocks(self) -> list:
        """The blocks (user_id, ipu_id) the last forward entered."""
        return self.seen.blocks

    def forward(self, *tensors: Any) -> Any:
        assert self.call is not None  # the executor sets it before the first call
        spec, template = self.call
        given = iter(tensors)
        leaves = [_leaf(x, given) for x in template]
        args, kwargs = pytree.tree_unflatten(leaves, spec)
        with (
            marks.recording(self.for_training) as seen,
            _no_distribution_checks(),
            watching(check_static_size),
            watching(blocks.check_in_block),
            plain_constants(self.model),  # PopTorch keeps no writes into them
            contextlib.ExitStack() as rules,
        ):
            for rule in self.rules:
                rules.enter_context(ruling(rule))
            out = self.custom.plain(self.model(*args, **kwargs))
        self.seen.blocks[:] = seen.blocks
        _check_overlap_outputs(seen, out)
        check_refused(out)  # what PopTorch would not compile
        if not self.for_training:
            return out
        loss = losses.final_loss(seen.losses, out)
        if loss is None:
            loss = _last_tensor(out, self.model)
        train = loss if _is_scalar(loss) else loss.sum()
        if self.loss_factor != 1.0:
            train = train * self.loss_factor
        return train, out


def _check_overlap_outputs(seen: marks.Marks, out: Any) -> None:
    """PopTorch's check: a tensor marked for overlapped output is one the model returns."""
    returned = {id(x) for x in pytree.tree_leaves(out)}
    if any(id(t) not in returned for t in seen.overlap_outputs):
        raise Error(
            "poptorch.set_overlap_for_output applied on a node which is not a tensor output "
            "to the model."
        )


@contextlib.contextmanager
def _no_distribution_checks() -> Iterator[None]:
    """torch.distributions' argument checks branch on tensor values; PopTorch turns them off
    while it traces a model, and so does this."""
    saved = torch.distributions.Distribution._validate_args
    torch.distributions.Distribution.set_default_validate_args(False)
    try:
        yield
    finally:
        torch.distributions.Distribution.set_default_validate_args(saved)


def _is_scalar(t: Any) -> bool:
    example = t.node.meta.get("example_value") if isinstance(t, torch.fx.Proxy) else t
    return isinstance(example, torch.Tensor) and example.dim() == 0


def _last_tensor(out: Any, model: nn.Module) -> Any:
    leaves = [x for x in pytree.tree_leaves(out) if isinstance(x, (torch.Tensor, torch.fx.Proxy))]
    if not leaves:
        raise Error(
            f"{type(model).__name__}.forward returns no tensor, so a trainingModel has no loss; "
            "return the loss (or mark it with poptorch.identity_loss)."
        )
    return leaves[-1]
