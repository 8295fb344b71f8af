"""What `import popxl_core, addons, popxl_fx` (and `import poptorch`) costs a process that never
asks for the fast mode: none of torch's compiler stack. torch._inductor and torch._dynamo
(with sympy) took 2.4 of the 4.9 s of CPU those imports took (python -X importtime), paid by
every script, every xdist worker and every child process the tests start."""

from __future__ import annotations

import subprocess
import sys

# imported only when a program is compiled with CompileOptions(inductor=True)
# (sim/inductor_step.compile_step), or by torch itself (torch.optim imports torch._dynamo)
COMPILER = ("torch._inductor", "torch._dynamo", "sympy")

_PROBE = (
    "import sys, popxl_core, addons, popxl_fx, popxl_fx.poptorch\n"
    f"print(sorted(m for m in {COMPILER!r} if m in sys.modules))\n"
)


def test_the_product_imports_without_torchs_compiler():
    run = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "[]"
