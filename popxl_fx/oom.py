"""The out-of-memory error of a traced model, in the model's terms.

`module_table` sorts what an IPU holds at its peak into one row per torch module (the user's
names; backward ops carry the module path of the forward op they differentiate) and four
categories, because the remedy follows the category:

    weights      parameters and buffers on chip (always live), or loaded for a phase
    gradients    tensors the backward made, live at the peak (weight gradients waiting for
                 the optimizer, activation gradients)
    optimizer    optimizer state (always live, or loaded) and the update's temporaries
    activations  forward tensors kept for the backward, and the forward's own temporaries

`oom_message` prints the table -- the repeated blocks first, one row per structure
(`grouped`: ``blocks.0-23 (24 x Block)``, what phases or outlining act on), then the largest
other modules -- then `remedies`: the exact ``Options(...)`` to try, ranked by the bytes each
is estimated to save (estimates from the table: ``memory="auto"`` plans the candidates
themselves). Only options estimated to save the whole overflow alone are offered as fixes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import popxl_core as popxl
from popxl_core.sim.cost import nbytes_of
from popxl_core.sim.liveness import live_at_peak
from popxl_core.sim.remote_plan import is_remote_variable
from popxl_core.sim.report import fmt_bytes

from .options import Options
from .outline import candidates

__all__ = [
    "ModuleRow",
    "Repeated",
    "grouped",
    "module_table",
    "oom_message",
    "remedies",
    "repeated_blocks",
]

CATEGORIES = ("weights", "gradients", "optimizer", "activations")
_OPTIMIZER = "optimizer."  # state variables' and update ops' prefix (`optim.py`)
_PROGRAM = "(program: inputs, seeds, other)"


@dataclass
class ModuleRow:
    """Bytes one torch module holds at the peak, per category."""

    module: str
    weights: int = 0
    gradients: int = 0
    optimizer: int = 0
    activations: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations


def _owner(name: str) -> str:
    """The module of a torch tensor name (``"blocks.0.attn.weight"`` -> ``"blocks.0.attn"``)."""
    return name.rsplit(".", 1)[0] if "." in name else "<root>"


def _short(name: str, prefix: str) -> str:
    return name[len(prefix) :] if prefix and name.startswith(prefix) else name


def _variable_row(name: str, prefix: str, params: set[str]) -> tuple[str, str]:
    name = _short(name.split("__t")[0], prefix)
    if name.startswith(_OPTIMIZER):
        return _owner(name[len(_OPTIMIZER) :].rsplit(".", 1)[0]), "optimizer"
    return (_owner(name), "weights") if name in params else (_PROGRAM, "weights")


def _origin(t: popxl.Tensor):
    """The op that computed ``t``'s value: through call outputs into the called graph."""
    op = t.producer
    while op is not None and op.called_graphs and t in op.outputs:
        callee = op.called_graphs[0]
        k = op.outputs.index(t)
        if k >= len(callee.outputs):
            break
        t = callee.outputs[k]
        op = t.producer
    return op


def _live_row(t: popxl.Tensor, prefix: str, params: set[str]) -> tuple[str, str]:
    op = _origin(t)
    if op is None:
        return _PROGRAM, "activations"
    path = getattr(op, "module_path", None)
    if op.type == "RemoteLoad":  # a phase's weights or optimizer state, loaded
        return _variable_row(t.name or t.id, prefix, params)
    if path and path.startswith(_OPTIMIZER):
        return _owner(path[len(_OPTIMIZER) :]), "optimizer"
    if path is None:
        return _PROGRAM, "activations"
    module = _short(path, prefix) if path not in ("<root>", prefix.rstrip(".")) else "<root>"
    backward = "_bwd" in (op.graph.id or "")
    return module, "gradients" if backward else "activations"


def module_table(plan, ipu: int, prefix: str, params: set[str]) -> list[ModuleRow]:
    """Per torch module, the bytes of each category on ``ipu`` at its peak (largest first).

    Args:
        plan: the simulator's `Plan`.
        prefix: where the user's model sits in the traced root (stripped from names).
        params: the model's parameter and buffer names (without ``prefix``).
    """
    rows: dict[str, ModuleRow] = {}

    def add(where: tuple[str, str], nbytes: int) -> None:
        row = rows.setdefault(where[0], ModuleRow(where[0]))
        setattr(row, where[1], getattr(row, where[1]) + nbytes)

    for v in plan.main.variables:
        if v.ipu == ipu and not is_remote_variable(v):
            add(_variable_row(v.name or v.id, prefix, params), nbytes_of(v))
    for t in live_at_peak(plan.analysis, plan.main, ipu):
        add(_live_row(t, prefix, params), nbytes_of(t))
    return sorted(rows.values(), key=lambda r: (-r.total, _natural(r.module)))


def _natural(name: str) -> tuple:
    """``"blocks.2.fc"`` before ``"blocks.10.fc"`` among equal rows (numbers as numbers)."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in name.split("."))


@dataclass(frozen=True)
class Repeated:
    """Repeated blocks shown as one row: ``blocks.0-23 (24 x Block)``."""

    paths: tuple[str, ...]
    kind: str  # the blocks' class name

    @property
    def label(self) -> str:
        return f"{_span(self.paths)} ({len(self.paths)} x {self.kind})"

    @property
    def star(self) -> str:
        """The outlined block graph's module path (``"blocks.*"``: `outline.Group.label`),
        which names the ops its calls run; "" when the paths differ in more than one part."""
        parts = [p.split(".") for p in self.paths]
        if len({len(p) for p in parts}) != 1:
            return ""
        diff = [i for i in range(len(parts[0])) if len({p[i] for p in parts}) > 1]
        if len(diff) != 1:
            return ""
        return ".".join("*" if i in diff else s for i, s in enumerate(parts[0]))

    def holds(self, module: str) -> bool:
        """``module`` is one of the blocks, inside one, or inside the outlined block graph."""
        star = [self.star] if self.star else []
        return any(module == p or module.startswith(p + ".") for p in (*self.paths, *star))


def repeated_blocks(model) -> list[Repeated]:
    """The outermost repeated blocks of ``model`` (as ``outline="auto"`` finds them), one
    `Repeated` per structure: a block's own repeated parts are counted in the block's row."""
    groups = sorted(candidates(model).items(), key=lambda kv: (kv[1][0].count("."), -len(kv[1])))
    found: list[Repeated] = []
    for key, paths in groups:
        if not any(r.holds(p) for r in found for p in paths):
            found.append(Repeated(tuple(paths), key[0].__name__))
    return found


def _span(paths: tuple[str, ...]) -> str:
    """``blocks.0 .. blocks.23`` -> ``"blocks.0-23"`` (a run of numbers after one stem)."""
    matches = [re.fullmatch(r"(.*?)(\d+)", p) for p in paths]
    split = [m for m in matches if m is not None]
    if len(split) == len(matches) and len({m.group(1) for m in split}) == 1:
        numbers = [int(m.group(2)) for m in split]
        if numbers == list(range(numbers[0], numbers[0] + len(numbers))):
            return f"{split[0].group(1)}{numbers[0]}-{numbers[-1]}"
    return ", ".join(paths) if len(paths) <= 3 else f"{paths[0]} .. {paths[-1]}"


def grouped(rows: list[ModuleRow], repeated: list[Repeated]) -> list[ModuleRow]:
    """The rows with each repeated group's modules summed into one row, the groups first
    (largest first), then the modules outside them (largest first)."""
    groups = {r.label: ModuleRow(r.label) for r in repeated}
    single = []
    for row in rows:
        owner = next((r for r in repeated if r.holds(row.module)), None)
        if owner is None:
            single.append(row)
            continue
        total = groups[owner.label]
        for c in CATEGORIES:
            setattr(total, c, getattr(total, c) + getattr(row, c))
    kept = sorted((g for g in groups.values() if g.total), key=lambda r: -r.total)
    return kept + single


def _table_text(rows: list[ModuleRow], limit: int = 12) -> list[str]:
    width = max([len(r.module) for r in rows[:limit]] + [6])
    head = f"    {'module':<{width}}  " + "  ".join(f"{c:>11}" for c in (*CATEGORIES, "total"))
    lines = [head]
    for r in rows[:limit]:
        cells = [getattr(r, c) for c in CATEGORIES] + [r.total]
        lines.append(f"    {r.module:<{width}}  " + "  ".join(f"{fmt_bytes(b):>11}" for b in cells))
    if len(rows) > limit:
        rest = sum(r.total for r in rows[limit:])
        lines.append(f"    ... {len(rows) - limit} more modules, {fmt_bytes(rest)}")
    return lines


def _sum(rows: list[ModuleRow], category: str) -> int:
    return sum(getattr(r, category) for r in rows)


def remedies(
    rows: list[ModuleRow], options: Options, blocks: int, floor: int = 1
) -> list[tuple[int, str]]:
    """``(estimated bytes saved, "Options(...)")`` for the options worth trying, best first.

    Args:
        blocks: how many repeated blocks ``outline="auto"`` would find (0: none).
        floor: leave out options saving less (the error asks for 1% of the overflow).
    """
    o, a = _sum(rows, "optimizer"), _sum(rows, "activations")
    held = [r.weights + r.gradients + r.optimizer for r in rows if r.module != _PROGRAM]
    found: list[tuple[int, str]] = []
    if options.phased_execution is False and held:
        kind = "blocks" if blocks else "children"
        saved = sum(held) - max(held)  # roughly: one phase's weights, gradients and state stay
        found.append((saved, f"Options(phased_execution={kind!r})"))
    r = options.replication_factor
    if r > 1 and not options.replicated_tensor_sharding and o:
        saved = o - o // r
        found.append((saved, f"Options(replication_factor={r}, replicated_tensor_sharding=True)"))
    if r == 1 and o:  # optimizer state halved over two replicas (each on half the batch)
        found.append(
            (o - o // 2, "Options(replication_factor=2, replicated_tensor_sharding=True) (2 IPUs)")
        )
    alone = options.phased_execution is False  # phased does not combine with these yet
    if blocks and options.outline is False and a and alone:
        saved = a - a // blocks  # one block's activations instead of all of them
        found.append((saved, "Options(outline='auto', recompute=True)"))
    if a and alone:
        k = 2 * options.gradient_accumulation
        found.append((a - a // 2, f"Options(gradient_accumulation={k}) (a batch dividing by {k})"))
    return sorted(((s, text) for s, text in found if s >= floor), key=lambda x: -x[0])


def oom_message(err, options: Options, prefix: str, params: set[str], repeated: list) -> str:
    """The user's OOM error: the overflow, the per-module table (repeated blocks grouped
    first) and the ranked remedies.

    Args:
        repeated: the model's outermost repeated blocks (`Repeated`), one row each.
    """
    plan = err.plan
    ipu = plan.out_of_memory[0]
    m = plan.memory[ipu]
    rows = module_table(plan, ipu, prefix, params)
    blocks = max((len(r.paths) for r in repeated), default=0)
    over = m.total - m.capacity
    tried = remedies(rows, options, blocks, max(1, over // 100))
    lines = [
        f"popxl_fx: the model does not fit one IPU with device={options.device!r}: the peak "
        f"needs {fmt_bytes(m.total)}, the IPU has {fmt_bytes(m.capacity)} (over by "
        f"{fmt_bytes(over)}; code {fmt_bytes(m.code)} and stream buffers "
        f"{fmt_bytes(m.streams)} of it are not per module).",
        "  What each module holds at the peak (torch names; repeated blocks first, then the "
        "largest modules):",
        *_table_text(grouped(rows, repeated)),
        *_remedy_text(tried, over),
        "  Or Options(device='ipu_model') to run it anyway (with a warning), "
        "Options(device='cpu') to ignore IPU limits.",
        f"Simulator estimate: {err}",
    ]
    return "\n".join(lines)


def _remedy_text(tried: list[tuple[int, str]], over: int) -> list[str]:
    """The remedies estimated to save the whole overflow alone; only when none does, the
    partial ones, said to be partial (an Options(...) offered as a fix must be one)."""
    enough = [(saved, text) for saved, text in tried if saved >= over]
    if enough:
        return [
            "  Options to try, by estimated bytes saved:",
            *[f"    {text}: about {fmt_bytes(saved)}" for saved, text in enough],
            "    Options(memory='auto'): plans these and their combinations exactly, and trains "
            "the fastest that fits",
        ]
    if not tried:
        return ["  No option saves enough: a smaller model or batch."]
    return [
        f"  No option alone is estimated to save the {fmt_bytes(over)}; each saves part "
        "(combined, or with a smaller model or batch):",
        *[f"    {text}: about {fmt_bytes(saved)}" for saved, text in tried],
    ]
