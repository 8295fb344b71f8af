"""Seed 003 (phased execution) as programs to plan and compare, built by the seed's own code.

The seed lives outside the repo (``../shared/seeds``; nothing of it is copied here).
`definitions` runs its notebook cells up to the first one that loads data and trains, so the
seed's layers, ``Adam``, ``Graphs``, batch-serialisation helpers, ``opts`` and
``train_program`` are defined and nothing has run. `phased_session` is the seed's own
training Session (replication 2, gradient accumulation 4, seven phases, remote variables with
RTS, "io" mode); `unphased_program` is the same MLP, built from the seed's ``Net`` and
``Adam``, with everything on chip: one replica, the whole global batch in one step.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import seed_runner

__all__ = ["FIRST_DATA_CELL", "definitions", "find", "phased_session", "unphased_program"]

FIRST_DATA_CELL = "global_batch_size ="  # the seed's first cell that needs the dataset


def find(seeds_dir: Optional[Path] = None) -> Optional[Path]:
    """The seed 003 file in ``seeds_dir`` (default: $POPXL_FX_SEEDS_DIR or ../shared/seeds),
    None when it is not there."""
    from popxl_fx.cli import default_seeds_dir

    hits = sorted(Path(seeds_dir or default_seeds_dir()).glob("003_*.txt"))
    return hits[0] if hits else None


def definitions(path: Path) -> dict:
    """The seed's namespace after its cells before `FIRST_DATA_CELL` ran (``popxl`` and
    ``popxl_addons`` resolved to this project)."""
    from popxl_core import compat

    compat.install()
    ns: dict = {"__name__": "__main__", "__file__": str(path)}
    for block in seed_runner.python_blocks(path):
        if FIRST_DATA_CELL in block.text:
            return ns
        # padding keeps the seed's own line numbers in tracebacks
        exec(compile("\n" * (block.line - 1) + block.text, str(path), "exec"), ns)
    raise ValueError(f"{path}: no cell containing {FIRST_DATA_CELL!r}; is it seed 003?")


def phased_session(ns: dict):
    """The seed's ``train_program(opts)``: (session, input streams, variables, loss stream)."""
    return ns["train_program"](ns["opts"])


def unphased_program(ns: dict, batch: int, device: str = "ipu_hw"):
    """The seed's MLP, one replica, one step per global batch of ``batch``: forward, loss,
    backward and the seed's Adam (no bias correction, as the seed's phases), all on chip."""
    popxl, addons, ops = ns["popxl"], ns["addons"], ns["ops"]
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence(True):
        img = popxl.h2d_stream((batch, 28 * 28), popxl.float32, "image")
        lbl = popxl.h2d_stream((batch,), popxl.int32, "labels")
        x, labels = ops.host_load(img), ops.host_load(lbl)
        facts, fwd = ns["Net"]().create_graph(x)
        bwd = addons.autodiff(fwd, grads_required=fwd.args.tensors)
        variables = facts.init()
        info = fwd.bind(variables).call_with_info(x)
        loss, dlogits = addons.cross_entropy_with_grad(info.parent_output(0), labels)
        grad_info = bwd.call_with_info(dlogits, args=bwd.grad_graph_info.inputs_dict(info))
        grads = bwd.grad_graph_info.fwd_parent_ins_to_grad_parent_outs(info, grad_info)
        adam = ns["Adam"](cache=True)
        for name, var in sorted(variables.to_dict().items()):
            o_facts, o_graph = adam.create_graph(var, grads[var], lr=1e-3, bias_correction=False)
            o_graph.bind(o_facts.init(prefix=f"adam.{name}")).call(var, grads[var])
        loss_stream = popxl.d2h_stream((), popxl.float32, "loss")
        ops.host_store(loss_stream, loss)
    return popxl.Session(ir, device), (img, lbl), variables, loss_stream
