"""PopART's fully connected pass for matmuls, switched on or off for a whole Ir.

The pass changes how Poplar lays out a matmul's operands (and so the tile memory), never the
result; the simulator records the setting (``op.settings["use_fully_connected_pass"]``).
"""

from __future__ import annotations

import popxl_core

__all__ = ["enable_fc_pass", "disable_fc_pass"]

_KEY = "use_fully_connected_pass"


def enable_fc_pass(ir: popxl_core.Ir) -> None:
    """Use the fully connected pass for every MatMul of ``ir``."""
    _set(ir, True)


def disable_fc_pass(ir: popxl_core.Ir) -> None:
    """Do not use the fully connected pass for any MatMul of ``ir``.

    >>> import numpy as np
    >>> ir = popxl_core.Ir()
    >>> with ir.main_graph:
    ...     w = popxl_core.variable(np.ones((2, 2), np.float32))
    ...     y = w @ w
    >>> disable_fc_pass(ir)
    >>> y.producer.settings
    {'use_fully_connected_pass': False}
    """
    _set(ir, False)


def _set(ir: popxl_core.Ir, value: bool) -> None:
    ir.check_editable("setting the fully connected pass")
    for g in ir.graphs:
        for op in g.ops:
            if op.opType() == "MatMul":  # pow2-scaled matmuls too, as in PopXL
                op.settings[_KEY] = value
