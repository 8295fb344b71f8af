"""Lowerings of optional packages' functions (torchvision's stochastic depth) are registered
when the package is imported, so ``import popxl_fx`` does not import torchvision itself; the
registration must find the function fx records as the node's target even though, while
torch.fx traces, the package's global is torch.fx's patched wrapper of it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

_SCRIPT = textwrap.dedent(
    """
    import sys
    import popxl_fx
    import popxl_fx.fallback
    assert "torchvision" not in sys.modules, "import popxl_fx imported torchvision"

    import functools
    import torch
    import torchvision
    sd_module = sys.modules["torchvision.ops.stochastic_depth"]
    from popxl_fx.lowering import lookup

    # the first lookup happens mid-trace, where torch.fx has patched the module's global
    original = sd_module.stochastic_depth
    sd_module.stochastic_depth = functools.wraps(original)(lambda *a, **k: original(*a, **k))
    try:
        assert lookup(original) is not None, "the node's target has no lowering"
    finally:
        sd_module.stochastic_depth = original
    import popxl_core as popxl
    from popxl_fx.module import Module

    def no_fallback(node, *args, **kwargs):
        raise AssertionError(f"{node.format_node()} needed the ATen fallback")

    popxl_fx.fallback.lower_by_decomposition = no_fallback

    class Block(torch.nn.Module):  # a child module: the table is first consulted mid-trace
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 3)

        def forward(self, x):
            return torchvision.ops.stochastic_depth(self.fc(x), 0.25, "row", True)

    ir = popxl.Ir()
    with ir.main_graph:
        _, graph = Module(Block()).create_graph(popxl.TensorSpec((4, 3), popxl.float32))
    assert graph.graph.outputs[0].shape == (4, 3)
    print("ok")
    """
)


def test_torchvision_lowering_registers_on_first_use_during_tracing():
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"
