"""The torchvision classification set on popxl_fx against eager: every builder of
``torchvision.models.list_models(module=torchvision.models)`` (plus a small custom
SwinTransformer), random init, ``num_classes=10``, dropout as built, at the smallest input it
accepts: forward in eval mode, then 2 SGD-momentum steps in train mode (dropout drawn from
torch's generator, the default ``Options(rng="torch")``), against eager.

Writes benchmarks/TORCHVISION.md: model, parameters, input, build seconds, max |forward diff|
(eval), max |parameter diff| after 2 steps; models too large for this host are listed with
the reason instead of run.

Usage::

    python -m benchmarks.torchvision_table                 # every builder (hours on 2 cores)
    python -m benchmarks.torchvision_table resnet18 swin_small   # some
    python -m benchmarks.torchvision_table --families      # the slow tier's sample

tests/test_fx_torchvision_table.py runs the family sample in the slow tier, and every builder
with ``POPXL_FX_TORCHVISION_ALL=1``.
"""

from __future__ import annotations

import argparse
import copy
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["FAMILY_SAMPLE", "Row", "builders", "family", "input_size", "measure", "too_large"]

# parameters above which a model is not run here (weights, momentum, gradients, the eager twin
# and the simulator's buffers: ~8 copies of float32 weights on a 24 GiB host shared by others)
MAX_PARAMS = 150_000_000
# the smallest square input each family accepts (fixed-size models: their own size)
_MIN_SIZE = {
    "alexnet": 63,  # five stride-2 stages before a 6x6 adaptive pool
    "inception": 75,
    "googlenet": 32,
    "maxvit": 224,  # its attention windows are built for the default input size
    "vit": 32,  # image_size= builds position embeddings for it
}
# the slow tier's sample: one light builder per family that tests/test_fx_models.py does not
# already train (resnet18, mobilenet_v2, vgg11_bn, efficientnet_b0, vit_b_16 run there), under
# ~30 M parameters so the sample fits CI's budget; POPXL_FX_TORCHVISION_ALL runs every builder
FAMILY_SAMPLE = [
    "convnext_tiny",
    "densenet121",
    "googlenet",
    "mnasnet0_5",
    "mobilenet_v3_small",
    "regnet_x_400mf",
    "regnet_y_400mf",
    "shufflenet_v2_x0_5",
    "squeezenet1_1",
    "swin_small",
]


def family(name: str) -> str:
    return re.match(r"[a-z]+", name).group(0)


def builders() -> list[str]:
    """Every torchvision classifier builder, and ``swin_small`` (a small custom Swin)."""
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models)) + ["swin_small"]


def input_size(name: str) -> int:
    return _MIN_SIZE.get(family(name), 32)


def build(name: str) -> nn.Module:
    import torchvision
    from torchvision.models.swin_transformer import SwinTransformer

    torch.manual_seed(0)
    if name == "swin_small":  # 2 stages of a Swin-T shape, small enough for the fast suite
        return SwinTransformer([4, 4], 16, [2, 2], [2, 4], [4, 4], num_classes=10)
    kwargs: dict = {"num_classes": 10}
    if family(name) == "vit":
        kwargs["image_size"] = input_size(name)
    if name in ("googlenet", "inception_v3"):
        kwargs["aux_logits"], kwargs["init_weights"] = False, True
    return torchvision.models.get_model(name, **kwargs)


def too_large(name: str) -> str | None:
    """Why ``name`` is not run on this host, or None."""
    n = _param_count(name)
    if n > MAX_PARAMS:
        return f"{n / 1e6:.0f} M parameters: host memory (limit {MAX_PARAMS / 1e6:.0f} M here)"
    return None


def _param_count(name: str) -> int:
    """Parameters of the ImageNet model (torchvision's weights metadata; close to ours with
    10 classes), or counted on the model where there are no published weights."""
    import torchvision

    if name in torchvision.models.list_models(module=torchvision.models):
        return torchvision.models.get_model_weights(name).DEFAULT.meta["num_params"]
    return sum(p.numel() for p in build(name).parameters())


@dataclass
class Row:
    name: str
    params_m: float
    size: int
    build_s: float
    forward_diff: float
    param_diff: float


def _max_diff(a, b) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b)) if a else 0.0


# batch 2 makes some builders' own eager training diverge: regnet_x_400mf's batch norm at
# the 1x1 last stage gives NaN weights after 2 SGD-momentum steps in eager PyTorch itself, so
# there is nothing to compare; batch 4 keeps eager finite
_BATCH = {"regnet_x_400mf": 4}


def measure(name: str, batch: int | None = None) -> Row:
    """Eval forward and 2 SGD-momentum train steps on the simulator and eagerly."""
    import popxl_fx

    batch = batch or _BATCH.get(name, 2)

    model = build(name)
    size = input_size(name)
    x = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 10, (batch,), generator=torch.Generator().manual_seed(2))
    twin = copy.deepcopy(model)
    model.eval(), twin.eval()
    start = time.perf_counter()
    sim = popxl_fx.inference_model(model)
    got = sim(x)
    build_s = time.perf_counter() - start
    with torch.no_grad():
        forward = (got - twin(x)).abs().max().item()
    del sim
    model.train(), twin.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    eager_opt = torch.optim.SGD(twin.parameters(), lr=0.01, momentum=0.9)
    trainer = popxl_fx.training_model(model, opt, F.cross_entropy)
    for _ in range(2):
        state = torch.get_rng_state()  # the same dropout draws in both
        loss = F.cross_entropy(twin(x), y)
        eager_opt.zero_grad()
        loss.backward()
        eager_opt.step()
        torch.set_rng_state(state)
        trainer(x, y)
    eager_params = [p.detach() for p in twin.parameters()]
    if not all(p.isfinite().all() for p in eager_params):
        raise RuntimeError(
            f"{name}: eager PyTorch's own 2 training steps at batch {batch} give non-finite "
            "weights, so there is nothing to compare; give it a larger batch in _BATCH"
        )
    params = _max_diff([p.detach() for p in model.parameters()], eager_params)
    n = sum(p.numel() for p in model.parameters()) / 1e6
    return Row(name, n, size, build_s, forward, params)


def _markdown(rows: list[Row], skipped: dict[str, str]) -> str:
    lines = [
        "# torchvision classifiers on popxl_fx vs eager",
        "",
        "Random init, num_classes=10, dropout as built, batch 2 (4 where eager's own training",
        "diverges at 2, `_BATCH`) at the smallest input; build =",
        "trace + lower + Session of the eval program and its first run (seconds, this host);",
        "forward: eval mode; parameters: after 2 SGD-momentum steps in train mode.",
        "Written by `python -m benchmarks.torchvision_table`.",
        "",
        "| model | params (M) | input | build s | max fwd diff | max param diff (2 steps) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.name} | {r.params_m:.2f} | {r.size} | {r.build_s:.1f} | "
            f"{r.forward_diff:.3g} | {r.param_diff:.3g} |"
        )
    if skipped:
        lines += ["", "Not run here:", ""]
        lines += [f"- {n}: {why}" for n, why in sorted(skipped.items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*")
    parser.add_argument("--families", action="store_true", help="one builder per family")
    parser.add_argument("--out", default=str(Path(__file__).with_name("TORCHVISION.md")))
    args = parser.parse_args(argv)
    names = args.models or (FAMILY_SAMPLE if args.families else builders())
    rows, skipped = [], {}
    for name in names:
        why = too_large(name)
        if why:
            skipped[name] = why
            continue
        rows.append(measure(name))
        Path(args.out).write_text(_markdown(rows, skipped))  # so far: a long run can stop
        r = rows[-1]
        print(
            f"{name:20s} build {r.build_s:6.1f} s  fwd {r.forward_diff:.3g}  p {r.param_diff:.3g}"
        )
    Path(args.out).write_text(_markdown(rows, skipped))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
