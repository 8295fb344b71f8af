"""PopTorch's compile-time rule on ops whose output size eager reads from tensor data: an IPU
program has static shapes, so PopTorch refuses them unless the size is given, with its error.

popxl_fx itself takes such a size from the example inputs (``F.one_hot(x)`` has the classes
of the example); a PopTorch program gets PopTorch's error, raised as the op is captured.
"""

from __future__ import annotations

from typing import Any

import torch.fx as fx
import torch.nn.functional as F

from .errors import Error

__all__ = ["ONE_HOT_NEEDS_CLASSES", "check_static_size"]

# PopTorch's words
ONE_HOT_NEEDS_CLASSES = "OneHot num classes must be specified and must be constant."


def check_static_size(node: fx.Node, module: Any = None) -> None:
    """Raise PopTorch's error for ``node`` if it sizes its output from tensor data (a
    `popxl_fx.capture_watch` watcher)."""
    if node.op == "call_function" and node.target is F.one_hot:
        classes = node.kwargs.get("num_classes", node.args[1] if len(node.args) > 1 else -1)
        if classes == -1:
            raise Error(ONE_HOT_NEEDS_CLASSES)
