"""The data of a traced module's variables: its torch tensors by escaped name, a tensor as a
factory's data (zeros for weightless plans), and an outlined call site's own factories.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

import addons
import popxl_core as popxl

from .names import escape, unescape

__all__ = ["SEED_NAME", "host_data", "named_tensors", "site_factories", "zeros_for"]

SEED_NAME = "fx_random_seed"


def named_tensors(module: nn.Module) -> dict[str, tuple[str, torch.Tensor]]:
    # escaped: any legal torch name is a valid variable name (`popxl_fx.names`)
    names = {escape(n): ("param", t) for n, t in module.named_parameters()}
    names.update({escape(n): ("buffer", t) for n, t in module.named_buffers()})
    return names


def site_factories(
    facts: addons.NamedVariableFactories,
    root: nn.Module,
    path: str,
    weightless: bool | frozenset[str] = False,
):
    """The block's factories with the data of the call site at ``path``: its own torch
    tensors, and its own random seed (the sites' random streams differ, as inlined ops' do)."""
    site: dict[str, addons.VariableFactory] = {}
    for name, f in facts.to_dict().items():
        data: Callable[[], np.ndarray]
        if name == SEED_NAME:
            start = (int(torch.initial_seed()) + zlib.crc32(path.encode())) % (2**31)
            data = functools.partial(popxl.create_seeds, start)
        else:
            qualname = f"{path}.{name}"
            data = host_data(_tensor_at(root, qualname), zeros_for(weightless, qualname))
        site[name] = addons.VariableFactory(data, f.dtype, f.name, f.by_ref, f.replica_grouping)
    return addons.NamedVariableFactories.from_dict(site)


def _tensor_at(root: nn.Module, qualname: str) -> torch.Tensor:
    owner, _, attr = qualname.rpartition(".")
    return getattr(root.get_submodule(owner), attr)


def zeros_for(weightless: bool | frozenset[str], name: str) -> bool:
    """Whether the variable ``name`` is made weightless (`Module`'s ``weightless``)."""
    if isinstance(weightless, bool):
        return weightless
    return name in weightless or unescape(name) in weightless


def host_data(tensor: torch.Tensor, weightless: bool = False) -> Callable[[], np.ndarray]:
    """The factory's data: ``tensor``'s memory as a numpy array, which ``popxl.variable``
    copies when the variable is made (the variable's data is then its own snapshot). With
    ``weightless``, zeros of its shape and dtype instead: a broadcast of one zero, which popxl
    keeps as it is, so a plan costs no host memory for it until a Session attaches."""
    copies: list[np.ndarray] = []

    def data() -> np.ndarray:
        if not copies and weightless:
            dtype = torch.empty((), dtype=tensor.dtype).numpy().dtype
            copies.append(np.broadcast_to(np.zeros((), dtype), tuple(tensor.shape)))
        elif not copies:  # a view: popxl.variable copies it once (a second copy cost seconds)
            copies.append(tensor.detach().cpu().numpy())
        return copies[0]

    return data
