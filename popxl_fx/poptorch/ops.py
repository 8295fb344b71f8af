"""PopTorch's operations (``poptorch.identity_loss``, ``nop``, ``recomputationCheckpoint``,
...): each computes what PopTorch's op computes, in torch, so the traced program and eager
torch agree; ops that only steer Poplar's memory planning return their input unchanged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..lowerings import ctc_decoder, printing
from . import _notes, marks
from .control import cond, for_loop
from .enums import MatMulSerializationMode, OverlapMode
from .errors import Error, unsupported
from .multiconv import MultiConv

__all__ = [
    "CPU",
    "MultiConv",
    "NameScope",
    "cond",
    "ctc_beam_search_decoder",
    "custom_op",
    "for_loop",
    "identity_loss",
    "ipu_print_tensor",
    "nop",
    "recomputationCheckpoint",
    "serializedMatMul",
    "set_available_memory",
    "set_overlap_for_input",
    "set_overlap_for_output",
]

_REDUCTIONS = {"sum": torch.sum, "mean": torch.mean, "none": lambda x: x}


def identity_loss(x: torch.Tensor, reduction: str) -> torch.Tensor:
    """Mark ``x`` (reduced by ``reduction``: 'sum', 'mean' or 'none') as the training loss:
    the backward starts from ones at it."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"identity_loss(reduction={reduction!r}): give 'sum', 'mean' or 'none'.")
    loss = _REDUCTIONS[reduction](x)
    recording = marks.current()
    if recording is not None:
        recording.losses.append(loss)
    return loss


def ipu_print_tensor(
    tensor: torch.Tensor,
    title: str = "",
    print_gradient: bool = True,
    summarise_threshold: int = 1000,
    edge_items: int = 3,
    max_line_width: int = 75,
    digits: int = 8,
    float_format: str = "auto",
    separator: str = " ",
    open_bracket: str = "(",
    close_bracket: str = ")",
) -> torch.Tensor:
    """``tensor``, printed to stderr on every run of the compiled program in Poplar's layout
    (eager torch prints nothing, as PopTorch's CPU kernel)."""
    options = (summarise_threshold, edge_items, max_line_width, digits, float_format)
    args = (tensor, title, print_gradient, *options, separator, open_bracket, close_bracket)
    if not isinstance(tensor, torch.fx.Proxy):
        return tensor
    return tensor.tracer.create_proxy("call_function", printing.print_tensor, args, {})


def nop(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` itself (PopTorch keeps a no-op in the graph; the value is the same)."""
    return tensor


def recomputationCheckpoint(*tensors: torch.Tensor):
    """The tensors themselves: recomputation changes memory, not values."""
    _notes.note(
        "poptorch.recomputationCheckpoint",
        "use popxl_fx Options(recompute=True) with outlined blocks to recompute",
    )
    return tensors[0] if len(tensors) == 1 else tensors


def set_available_memory(tensor: torch.Tensor, available_memory_proportion: float):
    if not 0.0 < float(available_memory_proportion) <= 1.0:
        raise ValueError(
            f"set_available_memory({available_memory_proportion}): give a proportion in (0, 1]."
        )
    _notes.note("poptorch.set_available_memory", "the simulator plans no tiles")
    return tensor


def serializedMatMul(
    lhs: torch.Tensor,
    rhs: torch.Tensor,
    mode: MatMulSerializationMode,
    factor: int = 0,
    keep_precision: bool = False,
) -> torch.Tensor:
    """``lhs @ rhs``: the serialisation only splits the work, the product is the same."""
    mode = MatMulSerializationMode(mode)
    if mode != MatMulSerializationMode.Disabled and factor < 1:
        raise ValueError(f"serializedMatMul: factor must be 1 or more with {mode}.")
    return torch.matmul(lhs, rhs)


def set_overlap_for_input(input_tensors, mode: OverlapMode):
    """Marks inputs for overlapped IO (no effect on the values); each must be a model input,
    as PopTorch checks."""
    OverlapMode(mode)
    for t in _traced(input_tensors):
        if t.node.op != "placeholder":
            raise Error(
                "poptorch.set_overlap_for_input applied on a node which is not a tensor "
                "input to the model."
            )
    return input_tensors


def set_overlap_for_output(output_tensors, mode: OverlapMode):
    """Marks outputs for overlapped IO; the executor checks that the model returns them."""
    OverlapMode(mode)
    recording = marks.current()
    if recording is not None:
        recording.overlap_outputs.extend(_traced(output_tensors))
    return output_tensors


def _traced(tensors) -> list:
    leaves = tensors if isinstance(tensors, (list, tuple)) else [tensors]
    return [t for t in leaves if isinstance(t, torch.fx.Proxy)]


def custom_op(
    inputs,
    name: str,
    domain: str,
    domain_version: int,
    example_outputs,
    attributes: dict | None = None,
):
    raise unsupported(
        f"poptorch.custom_op ({domain}::{name})",
        "custom ops are compiled C++ PopART operators; write the op in torch instead",
    )


def ctc_beam_search_decoder(
    probs: torch.Tensor,
    lengths: torch.Tensor,
    blank: int = 0,
    beam_width: int = 100,
    top_paths: int = 1,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PopART's CTC beam search decoder on log-probabilities ``probs`` [T, N, C] with
    ``lengths`` [N] valid steps: the ``top_paths`` most likely label sequences' log-probabilities
    and lengths [N, top_paths] and labels [N, top_paths, T] (`lowerings.ctc_decoder`)."""
    for name, value in (("probs", probs), ("lengths", lengths)):
        if not isinstance(value, (torch.Tensor, torch.fx.Proxy)):
            raise Error(
                f"ctc_beam_search_decoder: {name} must be a torch.tensor argument. "
                f"{type(value)} is not supported."
            )
    args = (probs, lengths, int(blank), int(beam_width), int(top_paths))
    if not isinstance(probs, torch.fx.Proxy):
        return ctc_decoder.ctc_beam_search_decode(*args)
    return probs.tracer.create_proxy("call_function", ctc_decoder.ctc_beam_search_decode, args, {})


class CPU:
    """``poptorch.CPU(fn, ID)``: PopTorch runs ``fn`` on the host in the middle of the
    program; here it is captured with the model (the same arithmetic)."""

    def __init__(self, layer_to_call: Callable, ID: str) -> None:
        if not callable(layer_to_call):
            raise TypeError("poptorch.CPU takes a callable (a module or function) and an ID.")
        self._fn = layer_to_call
        self.ID = ID

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        root = _traced_root(args, kwargs)
        if root is None or not isinstance(self._fn, torch.nn.Module) or _inside(root, self._fn):
            return self._fn(*args, **kwargs)
        # a layer the model does not hold (PopTorch runs it on the host): its weights are
        # constants of the captured program, as they are outside the model's
        state = {**dict(self._fn.named_parameters()), **dict(self._fn.named_buffers())}
        state = {name: t.detach() for name, t in state.items()}
        return torch.func.functional_call(self._fn, state, args, kwargs)

    def registerPersistentData(self) -> None:
        pass


def _traced_root(args: tuple, kwargs: dict) -> torch.nn.Module | None:
    """The module torch.fx is tracing, when an argument is one of its proxies."""
    leaves = torch.utils._pytree.tree_leaves((args, kwargs))
    proxy = next((x for x in leaves if isinstance(x, torch.fx.Proxy)), None)
    return None if proxy is None else getattr(proxy.tracer, "root", None)


def _inside(root: torch.nn.Module, layer: torch.nn.Module) -> bool:
    return any(m is layer for m in root.modules())


class NameScope:
    """``with poptorch.NameScope(name):``: names PopART's ops; nothing to name here."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> NameScope:
        return self

    def __exit__(self, *exc) -> None:
        return None
