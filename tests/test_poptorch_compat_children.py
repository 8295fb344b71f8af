"""`python -m popxl_fx.compat SCRIPT`: a multiprocessing child started by spawn (or forkserver,
as poptorch.AsynchronousDataAccessor starts its worker) re-runs SCRIPT, whose top-level
``import poptorch`` must resolve there too. Such a child takes the parent's sys.path."""

from __future__ import annotations

import subprocess
import sys
import textwrap

_SCRIPT = textwrap.dedent(
    """
    import multiprocessing as mp

    import poptorch


    def child(q):
        import poptorch as again

        q.put(again.__name__)


    if __name__ == "__main__":
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        proc = ctx.Process(target=child, args=(q,))
        proc.start()
        print("child:", q.get(timeout=120), "parent:", poptorch.__name__)
        proc.join()
    """
)


def test_a_spawned_child_rerunning_the_script_imports_poptorch(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(_SCRIPT)
    run = subprocess.run(
        [sys.executable, "-m", "popxl_fx.compat", str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "child: popxl_fx.poptorch parent: popxl_fx.poptorch" in run.stdout
