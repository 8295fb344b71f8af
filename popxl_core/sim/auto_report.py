"""`POPXL_SIM_REPORT`: every Session's estimates written as it is built, for programs run unchanged.

Graphcore's applications never ask for a report, as Poplar's ``autoReport`` engine options write
one without the program asking. Set ``POPXL_SIM_REPORT`` to a folder to append each Session's
``report.summary()`` to ``FOLDER/sim_report.txt`` under a line naming the command, the device and
the IPUs it spans; ``-`` writes to stderr instead.

Example:
    >>> import os, tempfile, popxl_core as popxl
    >>> folder = tempfile.mkdtemp()
    >>> os.environ["POPXL_SIM_REPORT"] = folder
    >>> ir = popxl.Ir()
    >>> with ir.main_graph:
    ...     w = popxl.variable([1.0, 2.0], name="w")
    >>> _ = popxl.Session(ir, "ipu_model")
    >>> del os.environ["POPXL_SIM_REPORT"]
    >>> open(os.path.join(folder, "sim_report.txt")).read().count("IPU memory (estimate")
    1
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["ENV", "auto_report"]

ENV = "POPXL_SIM_REPORT"


def auto_report(session) -> None:
    """Write ``session``'s report where ``POPXL_SIM_REPORT`` says; nothing when it is unset."""
    where = os.environ.get(ENV)
    if not where:
        return
    text = f"{_header(session)}\n{session.report.summary()}\n"
    if where == "-":
        sys.stderr.write(text)
        return
    Path(where).mkdir(parents=True, exist_ok=True)
    with open(Path(where) / "sim_report.txt", "a") as f:
        f.write(text)


def _header(session) -> str:
    # the command line names the app's run and its configuration (layers, tensor parallel, ...)
    replicas = session.ir.replication_factor
    ipus = len(session.plan.memory) or 1
    command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv else "?"
    return (
        f"== Session ({command}) on {session.device_desc}: {replicas} replica(s) x {ipus} "
        f"IPU(s) = {replicas * ipus} IPU(s)"
    )
