"""Ops PopTorch refuses when it compiles, refused here with PopTorch's words.

popxl_fx lowers them (as eager computes them); a PopTorch program could not have used them,
and PopTorch's tests check that they raise. The check reads the graph torch.fx has captured
so far, from the model's outputs (fx proxies) inside the executor's wrapper.

- Upsampling in mode 'linear' (1-D) or 'trilinear' (3-D): PopTorch's canonicalisation has no
  handler for ``upsample_linear1d`` / ``upsample_trilinear3d`` ('nearest', 'bilinear' and
  'bicubic' run).
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch import fx, nn

from .errors import Error

__all__ = ["check_refused"]

_REFUSED_UPSAMPLING = ("linear", "trilinear")
_INTERPOLATE = (F.interpolate, F.upsample)
_MODE_AT = 3  # F.interpolate(input, size, scale_factor, mode, ...)


def check_refused(out: Any) -> None:
    """Raise `Error` for the first op PopTorch refuses in the graph that made ``out``."""
    proxies = [x for x in pytree.tree_leaves(out) if isinstance(x, fx.Proxy)]
    if not proxies:
        return  # not being captured
    tracer = proxies[0].tracer
    for node in tracer.graph.nodes:
        mode = _upsampling_mode(node, tracer.root)
        if mode in _REFUSED_UPSAMPLING:
            raise Error(
                f"Unsupported upsample mode {mode!r} ({node.meta.get('source', node.name)}): "
                "currently only 'nearest' is supported by PopTorch for 1-D and 3-D inputs "
                "(popxl_fx.inference_model computes it as eager does)."
            )


def _upsampling_mode(node: fx.Node, root: nn.Module) -> str | None:
    """The mode of an ``nn.Upsample`` call or an ``F.interpolate`` call (None otherwise)."""
    if node.op == "call_module":
        module = root.get_submodule(node.target)
        return module.mode if isinstance(module, nn.Upsample) else None
    if node.op == "call_function" and node.target in _INTERPOLATE:
        given = node.args[_MODE_AT] if len(node.args) > _MODE_AT else None
        return node.kwargs.get("mode", given or "nearest")
    return None
