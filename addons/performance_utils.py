"""FLOP counts of a program, as popxl.addons' ``performance_utils`` gives them.

`evaluate_FLOPs(graph)` is a breakdown: op type -> {op id: FLOPs} for the counted ops of the
graph (MatMul: 2·K per output element; Add, Sub, Mul, Div: one per output element;
GroupNormalization: popxl.addons' estimate), and for each Call or Loop op, every key of the
called graph's breakdown -> {``"<type>_<op id>(<graph>)"``: that graph's breakdown under the
key, times the Loop's repeat count}; ``"TOT"`` is the graph's total. Only Call and Loop are
descended (as popxl.addons does: an If's branches are not counted). `evaluate_ir_FLOPs(ir)` is
the main graph's breakdown times the replication factor and `total_FLOPs(ir)` its total.
`session.report` has the simulator's estimate of all ops.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import Any, Dict

import popxl_core
from popxl_core.utils import table_to_string

__all__ = [
    "evaluate_FLOPs",
    "evaluate_ir_FLOPs",
    "total_FLOPs",
    "format_flops_scientific",
    "print_FLOPs",
]


def _matmul_flops(op) -> int:
    """2·K multiply-adds per output element (a pow2-scaled float8 matmul too)."""
    return 2 * op.inputs[0].shape[-1] * math.prod(op.outputs[0].shape)


def _elementwise_flops(op) -> int:
    return math.prod(op.outputs[0].shape)


def _group_norm_flops(op) -> int:
    """popxl.addons' estimate: the mean, the variance, normalising, scale and bias."""
    x, out, mean = op.inputs[0].shape, op.outputs[0].shape, op.outputs[1].shape
    groups = int(mean[0] / x[0])
    averaged = int(x[-1] * x[-2] / groups)
    n_out = math.prod(out)
    return averaged + (2 * averaged + 2 * mean[0]) + 2 * n_out + n_out + n_out


_FLOPS = {
    "Add": _elementwise_flops,
    "Sub": _elementwise_flops,
    "Div": _elementwise_flops,
    "Mul": _elementwise_flops,
    "MatMul": _matmul_flops,
    "GroupNormalization": _group_norm_flops,
}


def _scaled(v, factor):
    if isinstance(v, dict):
        return {k: _scaled(x, factor) for k, x in v.items()}
    return v * factor


def _summed(v) -> int:
    return sum(map(_summed, v.values())) if isinstance(v, dict) else v


def _breakdown(graph, seen: Dict[Any, Dict[str, Any]]) -> Dict[str, Any]:
    if graph in seen:
        return seen[graph]
    total = 0
    out: Dict[str, Any] = defaultdict(dict)  # op type -> {op: flops}, and "TOT" -> total
    for op in graph.ops:
        if op.type in ("Call", "Loop"):
            called = op.called_graphs[0]
            sub = _breakdown(called, seen)
            if op.type == "Loop":
                sub = _scaled(sub, op.attrs["repeat_count"])
            total += sub["TOT"]
            key = f"{op.opType()}_{op.id}({re.sub(r'_subgraph[(][0-9]+[)]', '', called.id)})"
            for k, v in sub.items():
                out[k][key] = v
        elif op.opType() in _FLOPS:
            flops = int(_FLOPS[op.opType()](op))
            total += flops
            out[op.opType()][op.id] = flops
    out["TOT"] = total
    seen[graph] = out
    return out


def evaluate_FLOPs(graph: popxl_core.Graph) -> Dict[str, Any]:  # addons' name
    """The FLOPs breakdown of one execution of ``graph`` (see the module); ``"TOT"`` is the
    total.

    >>> import numpy as np
    >>> ir = popxl_core.Ir()
    >>> with ir.main_graph:
    ...     a = popxl_core.variable(np.ones((2, 3), np.float32))
    ...     b = popxl_core.variable(np.ones((3, 4), np.float32))
    ...     c = a @ b
    >>> evaluate_FLOPs(ir.main_graph)  # 2 * 3 per output element
    {'MatMul': {100: 48}, 'TOT': 48}
    """
    return dict(_breakdown(graph, {}))


def evaluate_ir_FLOPs(ir: popxl_core.Ir) -> Dict[str, Any]:
    """The breakdown of one run of ``ir``'s main graph, over all its replicas."""
    return _scaled(evaluate_FLOPs(ir.main_graph), ir.replication_factor)


def total_FLOPs(ir: popxl_core.Ir) -> int:
    """The total FLOPs of one run of ``ir`` (``evaluate_ir_FLOPs(ir)["TOT"]``)."""
    return evaluate_ir_FLOPs(ir)["TOT"]


def _flat(d: Dict[str, Any], into: Dict[str, int], prefix: str = "") -> Dict[str, int]:
    for k, v in d.items():
        name = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict):
            _flat(v, into, name)
        else:
            into[name] = v
    return into


def print_FLOPs(
    flops_breakdown: Dict[str, Any], mode: str = "type", numerical_format: str = "nearest3"
) -> None:
    """Print a breakdown as a table, sorted by FLOPs: per op type with its share of the
    total (``mode="type"``), or one row per op (``mode="flat"``, named by its keys' path)."""
    if mode == "type":
        per_type = {k: _summed(v) for k, v in flops_breakdown.items()}
        rows = [["Op Type", "FLOPs", "%"]]
        for k, v in sorted(per_type.items(), key=lambda kv: kv[1], reverse=True):
            share = 100 * v / per_type["TOT"]
            rows.append([k, format_flops_scientific(v, numerical_format), f"{share:.1f}"])
    elif mode == "flat":
        flat = _flat(flops_breakdown, {})
        rows = [["Op Type", "FLOPs", "Op Name"]]
        for k, v in sorted(flat.items(), key=lambda kv: kv[1], reverse=True):
            rows.append([k.split(".")[0], format_flops_scientific(v, numerical_format), k])
        rows.append(["TOT", format_flops_scientific(flat["TOT"], numerical_format), ""])
    else:
        raise ValueError("Unknown mode specified. Please use `type` or `flat`.")
    print(table_to_string(rows))


_UNITS = {"K": 3, "M": 6, "G": 9, "T": 12}


def format_flops_scientific(val, format: str = "nearest3") -> str:  # addons' name
    """``val`` as ``"<mantissa>E<sign><2-digit exponent>"`` with 3 decimals: the exponent the
    multiple of 3 nearest above or below (``"nearest3"``: 9072 -> ``"9.072E+03"``, 120000 ->
    ``"0.120E+06"``) or that of ``"K"``, ``"M"``, ``"G"``, ``"T"``."""
    if format != "nearest3" and format not in _UNITS:
        raise ValueError("unknown format specified")
    if format == "nearest3":
        power = math.floor(math.log10(abs(val))) if val > 0.0 else 0
        exp = 3 * (power // 3 + int(power % 3 == 2))
    else:
        exp = _UNITS[format]
    sign = "-" if exp < 0 else "+"
    return f"{val * 10.0 ** (-exp):.3f}E{sign}{abs(exp):02d}"
