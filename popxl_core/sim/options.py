"""`CompileOptions`: how a `Session` turns its Ir into a program, passed explicitly.

Each field is the switch of one compiler pass (`passes.PASSES`) or a test mode. Every pass
keeps the bits of the reference interpreter (`reference.py`): tests build the same Ir with
``CompileOptions(interpret=True)`` and compare, pass by pass (``transposed_matmuls`` under
``Ir.numerics == "torch"`` is eager PyTorch's own call for a linear layer's weight gradient,
which may differ from the unfused pair in the last bit; see `fuse.py`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["CompileOptions", "DEFAULT"]


@dataclass(frozen=True)
class CompileOptions:
    """How `compile.Program` compiles an Ir (all passes on by default).

    Args:
        interpret: run the plain reference interpreter (`reference.ReferenceProgram`) instead
            of compiling: what tests compare each pass with.
        check_specs: check every kernel's output shape and dtype against the op table's
            inference (test mode; the passes that replace per-op kernels by joint calls
            or torch calls in the source then stay off: direct, conv_pairs, variants).
        transposed_matmuls: a matrix transpose of a matmul's result in one kernel (fuse.py).
        foreach: same-kind elementwise ops of many tensors as one multi-tensor kernel
            (foreach.py), bitwise equal.
        foreach_fresh: also group ops that allocate their results, as torch.optim's foreach
            path does (False: only ops that can write into dead inputs; see foreach.py).
        conv_pairs: a convolution's data and weight gradients in one call (conv_pairs.py).
        direct: torch calls written into the generated source (direct.py).
        release: ``del`` each temporary after its last reader (release.py).
        defer_release: in a graph run once per run, the temporaries an in-place variable
            update reads last (its gradients) are freed when the next run starts, as eager
            frees ``.grad`` at ``zero_grad()``, not as the run ends (defer.py).
        handoff: a graph called once per run gets its arguments as a list it empties, so it
            frees each after its last reader (handoff.py).
        share_uniform: with replicas in lock step, work whose inputs are provably the same on
            every replica (an optimizer update from all-reduced gradients) runs once, by the
            first replica, on variable storage the replicas share (uniform.py).
        stack_replicas: with replicas in lock step, an op whose weight is the same tensor on
            every replica (a GEMM of a shared weight) computed for all of them by one kernel
            over their stacked rows, where that gives each replica the same bits (stacking.py).
        fold_replicas: with replicas in lock step that share their uniform work, the
            replicas' step run once over their values concatenated along dim 0, each op
            one kernel call for all of them where that gives each replica the same bits
            (fold.py); else as ``stack_replicas`` says.
        inductor: the opt-in fast mode, not bitwise: the whole step traced and compiled by
            inductor as one graph (inductor_step.py) where its only side effects are the main
            graph's host transfers; else every pure called graph (no streams, collectives,
            random draws or in-place writes) apart (inductor.py; popxl_fx
            ``Options(kernels="inductor")``).

    Example:
        >>> CompileOptions(foreach=False).transposed_matmuls
        True
    """

    interpret: bool = False
    check_specs: bool = False
    transposed_matmuls: bool = True
    foreach: bool = True
    foreach_fresh: bool = True
    conv_pairs: bool = True
    direct: bool = True
    release: bool = True
    defer_release: bool = True
    handoff: bool = True
    share_uniform: bool = True
    stack_replicas: bool = True
    fold_replicas: bool = True
    inductor: bool = False

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, bool):
                raise TypeError(f"CompileOptions({f.name}={value!r}): give True or False.")

    def runs(self, switch: str, per_op: bool = False) -> bool:
        """Whether the pass switched by field ``switch`` ("" for an unswitched pass) runs;
        ``per_op``: the pass replaces per-op kernels, so spec checks turn it off."""
        if per_op and self.check_specs:
            return False
        return not switch or getattr(self, switch)


DEFAULT = CompileOptions()  # every pass on
