"""popxl_core/sim/host_malloc.py: a step's temporaries reuse the pages the last step freed,
instead of faulting fresh zeroed pages in from the OS every step."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core import ops
from popxl_core.sim import host_malloc

# a fresh process (malloc's state is per process): AdamW steps of a 4096x1024 linear (16 MiB
# weights, state and temporaries of that size, freed together at the step's end), page
# faults counted over 3 steps. The baseline pins glibc's documented default thresholds
# (128 KiB): left alone, glibc raises them itself after the first large free, by an amount
# that depends on the allocation history, so an unpinned baseline differs between machines.
_STEPS = textwrap.dedent(
    """
    import importlib.util, inspect, resource, sys, torch
    from torch import nn
    # torch.optim's wrappers of add_param_group, zero_grad and step import torch._dynamo on
    # first use, to exclude them from compilation: 1.2 s of CPU, a third of this process.
    # Nothing here compiles: the wrapped functions run as is (step without grad, as its
    # wrapper runs it; the other two through their wrappers' cache of the function to call).
    for method in (torch.optim.Optimizer.add_param_group, torch.optim.Optimizer.zero_grad):
        method.__wrapped__.__dynamo_disable = method.__wrapped__
    adamw_step = inspect.unwrap(torch.optim.AdamW.step)
    # the module alone: importing popxl_core would take longer than the steps
    spec = importlib.util.spec_from_file_location("host_malloc", sys.argv[1])
    host_malloc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(host_malloc)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4096, 1024), nn.ReLU(), nn.Linear(1024, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(4, 4096), torch.randint(0, 10, (4,))
    def faults_per_step():
        for _ in range(3):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            with torch.no_grad():
                adamw_step(opt)
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    libc = host_malloc._glibc()
    assert libc.mallopt(-3, 128 << 10) and libc.mallopt(-1, 128 << 10)  # M_MMAP_, M_TRIM_
    faults_per_step()
    before = faults_per_step()
    print(faults_per_step() - before)  # glibc's default thresholds, held fixed
    assert host_malloc.keep_freed_memory()
    faults_per_step()
    before = faults_per_step()
    print(faults_per_step() - before)
    assert "torch._dynamo" not in sys.modules
    """
)
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(host_malloc._glibc() is None, reason="glibc's malloc only")
def test_a_step_reuses_the_last_steps_pages():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-c", _STEPS, host_malloc.__file__]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env, cwd=_ROOT)
    default, kept = (float(n) / 3 for n in out.stdout.split())
    # default thresholds: each step faults its 16 MiB temporaries' pages in again (4096
    # each, about 12,290 a step here); kept: none, or once in a while a block the heap grows by
    assert default > 4000, default
    assert kept < default / 4, (default, kept)


def test_a_session_keeps_freed_memory(monkeypatch):
    monkeypatch.setattr(host_malloc, "_done", [])
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(4, np.float32))
        ops.host_store(popxl.d2h_stream(x.shape, x.dtype, "y"), x + 1)
    popxl.Session(ir, "ipu_model")
    assert host_malloc._done == [host_malloc._glibc() is not None]


def test_the_users_malloc_settings_win(monkeypatch):
    monkeypatch.setattr(host_malloc, "_done", [])
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert host_malloc.keep_freed_memory() is False
    assert host_malloc.keep_freed_memory() is False  # decided once
