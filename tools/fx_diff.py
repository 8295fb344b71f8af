"""Find the first op where the simulator's arithmetic leaves eager torch's, module by module.

Runs the model eagerly once with forward hooks on every submodule, recording each one's inputs
and an output cotangent; then runs each recorded submodule alone through `popxl_fx.compile`
on exactly those inputs and reports the max abs difference of its outputs, input gradients
and parameter gradients against eager autograd. A bit-exact lowering shows 0.0 everywhere.

    python -m tools.fx_diff vit_b_16            # a zoo model (tests/fx_zoo.py)
    python -m tools.fx_diff seed_mlp --types Linear,GELU --first 2
"""

from __future__ import annotations

import argparse
import copy
import sys

import torch
import torch.utils._pytree as pytree
from torch import nn

import popxl_fx

__all__ = ["module_diffs", "main"]


def _record(model: nn.Module, inputs: tuple, types: set[str] | None, first: int) -> list:
    """[(path, module, args)] for the modules eager calls, ``first`` per module type."""
    seen: dict[str, int] = {}
    calls: list = []
    hooks = []
    for path, m in model.named_modules():
        name = type(m).__name__
        if not path or (types and name not in types):
            continue

        def hook(mod, args, kwargs, path=path, name=name):
            if seen.get(name, 0) < first:
                seen[name] = seen.get(name, 0) + 1
                kw = {k: _clone(v) for k, v in kwargs.items()}
                leaf = (_Leaf3 if len(args) == 3 else _Leaf)(mod, kw)
                calls.append((path, leaf, tuple(_clone(a) for a in args)))

        hooks.append(m.register_forward_pre_hook(hook, with_kwargs=True))
    with torch.no_grad():
        model(*inputs)
    for h in hooks:
        h.remove()
    return calls


class _Leaf(nn.Module):
    """``inner(*args, **kwargs)`` as the child of a root, so standard modules stay leaves."""

    def __init__(self, inner: nn.Module, kwargs: dict) -> None:
        super().__init__()
        self.inner, self.kwargs = inner, kwargs

    def forward(self, a):
        return self.inner(a, **self.kwargs)


class _Leaf3(_Leaf):
    def forward(self, a, b, c):  # fx traces fixed arities only; MHA: (out, weights or None)
        return self.inner(a, b, c, **self.kwargs)[0]


def _clone(a):
    return a.detach().clone() if isinstance(a, torch.Tensor) else a


def _grads(module: nn.Module, args: tuple, seed: int):
    """Outputs, input grads and parameter grads of ``module(*args)`` for a random cotangent."""
    args = tuple(
        a.detach().clone().requires_grad_(a.is_floating_point())
        if isinstance(a, torch.Tensor)
        else a
        for a in args
    )
    out = module(*args)
    leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    leaves = [t for t in leaves if t.requires_grad]
    gen = torch.Generator().manual_seed(seed)
    cot = [torch.randn(t.shape, generator=gen, dtype=t.dtype) for t in leaves]
    torch.autograd.backward(leaves, cot)
    ins = [a.grad for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    params = {n: p.grad for n, p in module.named_parameters() if p.grad is not None}
    return [t.detach() for t in leaves], ins, params


def _maxdiff(a, b) -> float:
    if a is None or b is None:
        return float("nan") if (a is None) != (b is None) else 0.0
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def module_diffs(model, inputs, types=None, first=1, options=None):
    """Yields (path, type, out diff, input-grad diff, worst param-grad diff, its name)."""
    for path, mod, args in _record(model, inputs, types, first):
        eager = copy.deepcopy(mod)
        sim = popxl_fx.compile(copy.deepcopy(mod), options or popxl_fx.Options(device="cpu"))
        e_out, e_in, e_p = _grads(eager, args, 0)
        s_out, s_in, s_p = _grads(sim, args, 0)
        out = max((_maxdiff(a, b) for a, b in zip(s_out, e_out)), default=0.0)
        ins = max((_maxdiff(a, b) for a, b in zip(s_in, e_in)), default=0.0)
        worst = max(((_maxdiff(s_p.get(n), g), n) for n, g in e_p.items()), default=(0.0, ""))
        yield (path, type(mod.inner).__name__, out, ins, *worst)


def main(argv=None) -> None:
    sys.path.insert(0, ".")
    from tests.fx_zoo import TORCHVISION, ZOO

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", choices=sorted({**ZOO, **TORCHVISION}))
    p.add_argument("--types", default="", help="comma-separated module type names")
    p.add_argument("--first", type=int, default=1, help="instances per module type")
    a = p.parse_args(argv)
    case = {**ZOO, **TORCHVISION}[a.model]()
    types = set(a.types.split(",")) if a.types else None
    print(f"{'module':40s} {'type':24s} {'out':>9s} {'d_in':>9s} {'d_param':>9s}  param")
    for path, name, out, ins, worst, pname in module_diffs(case.model, case.inputs, types, a.first):
        print(f"{path:40s} {name:24s} {out:9.2e} {ins:9.2e} {worst:9.2e}  {pname}", flush=True)


if __name__ == "__main__":
    main()
