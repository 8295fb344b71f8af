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
    python -m benchmarks.torchvision_table --resume        # skip the rows already written

Built for a long unattended run: builders go smallest first, each in its own process (its
memory is returned, a crash or a kill for memory becomes that row's error), and every row is
written to the output as it finishes, so a stopped run keeps its rows and ``--resume``
continues it. A builder that fails gets a row with the error class and its first line.

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

__all__ = [
    "FAMILY_SAMPLE",
    "Row",
    "builders",
    "by_size",
    "family",
    "input_size",
    "measure",
    "too_large",
]

# parameters above which a model is not run here: the measured peak resident memory is
# ~0.7 GiB + ~0.027 GiB per million parameters (weights, gradients, momentum, the eager
# twin's final weights, the simulator's variables; convnext_large, 196 M: 5.9 GiB), and a
# session may take ~8 GiB of this 24 GiB host shared by ~8 engineers
MAX_PARAMS = 200_000_000
_GIB_BASE, _GIB_PER_M = 0.7, 0.027
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
    "swin_v2_small",
]


def family(name: str) -> str:
    return re.match(r"[a-z]+", name).group(0)


def builders() -> list[str]:
    """Every torchvision classifier builder, and ``swin_small``/``swin_v2_small`` (small
    custom Swins: V1 and V2 blocks)."""
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models)) + [
        "swin_small",
        "swin_v2_small",
    ]


def input_size(name: str) -> int:
    size = _MIN_SIZE.get(family(name), 32)
    if family(name) == "vit":  # a whole number of patches: vit_h_14 takes 28, not 32
        patch = int(name.rsplit("_", 1)[1])
        size = max(patch, size // patch * patch)
    return size


def build(name: str) -> nn.Module:
    import torchvision
    from torchvision.models.swin_transformer import SwinTransformer

    torch.manual_seed(0)
    if name == "swin_small":  # 2 stages of a Swin-T shape, small enough for the fast suite
        return SwinTransformer([4, 4], 16, [2, 2], [2, 4], [4, 4], num_classes=10)
    if name == "swin_v2_small":  # the same with Swin V2's blocks (cosine attention, CPB MLP)
        from torchvision.models.swin_transformer import PatchMergingV2, SwinTransformerBlockV2

        return SwinTransformer(
            [4, 4], 16, [2, 2], [2, 4], [4, 4], num_classes=10,
            block=SwinTransformerBlockV2, downsample_layer=PatchMergingV2,
        )  # fmt: skip
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
        gib = _GIB_BASE + _GIB_PER_M * n / 1e6
        return (
            f"{n / 1e6:.0f} M parameters: host memory (~{gib:.0f} GiB projected from the "
            f"measured peaks; limit {MAX_PARAMS / 1e6:.0f} M here)"
        )
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
    batch: int
    build_s: float
    forward_diff: float
    param_diff: float
    peak_gib: float = 0.0  # the measuring process's peak resident memory
    device: str = "ipu_hw"  # Options.device of inference / training ("cpu": over one IPU)
    error: str = ""  # "ErrorClass: first line" where the builder failed


def by_size(names: list[str]) -> list[str]:
    """``names`` by parameter count, smallest first (a long run gets the most rows early)."""
    return sorted(names, key=lambda n: (_param_count(n), n))


def _max_diff(a, b) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b)) if a else 0.0


# batch 2 makes some builders' own eager training diverge: batch norm over 2 values at a 1x1
# last stage (regnet_x_400mf, efficientnet_b3/b4 at input 32) gives gradients up to 1e12 and
# NaN weights after 2 SGD-momentum steps in eager PyTorch itself, so there is nothing to
# compare; `measure` then doubles the batch (up to _MAX_BATCH); these start at 4
_BATCH = {"regnet_x_400mf": 4, "efficientnet_b3": 4, "efficientnet_b4": 4}
_MAX_BATCH = 8


def measure(name: str, batch: int | None = None) -> Row:
    """Eval forward and 2 SGD-momentum train steps on the simulator and eagerly, at batch 2
    (or ``_BATCH``'s), doubled while eager's own training gives non-finite weights."""
    batch = batch or _BATCH.get(name, 2)
    while True:
        row = _measure_at(name, batch)
        if row is not None:
            return row
        if batch * 2 > _MAX_BATCH:
            raise RuntimeError(
                f"{name}: eager PyTorch's own 2 training steps give non-finite weights up to "
                f"batch {batch}, so there is nothing to compare; give it a batch in _BATCH"
            )
        batch *= 2


def _measure_at(name: str, batch: int) -> Row | None:
    """The row at ``batch``; None where eager's own training gives non-finite weights."""
    import popxl_fx

    model = build(name)
    size = input_size(name)
    x = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 10, (batch,), generator=torch.Generator().manual_seed(2))
    twin = copy.deepcopy(model)
    model.eval(), twin.eval()
    start = time.perf_counter()
    with torch.no_grad():  # inference as users run it (the program follows the grad mode)
        got, infer_on = _on_a_device(lambda o: popxl_fx.inference_model(model, o)(x))
        build_s = time.perf_counter() - start
        forward = (got - twin(x)).abs().max().item()
    del got
    # eager's 2 steps first, keeping only its final weights and each step's generator state:
    # the twin's gradients and momentum are gone before the simulator's (host memory)
    states, eager_params = _eager_steps(twin, x, y)
    del twin
    if not all(p.isfinite().all() for p in eager_params):
        return None
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def first_step(options):
        trainer = popxl_fx.training_model(model, opt, F.cross_entropy, options)
        torch.set_rng_state(states[0])  # the same dropout draws as eager's step
        trainer(x, y)  # an IPU that is too small raises here, before the step
        return trainer

    trainer, train_on = _on_a_device(first_step)
    torch.set_rng_state(states[1])
    trainer(x, y)
    params = _max_diff([p.detach() for p in model.parameters()], eager_params)
    n = sum(p.numel() for p in model.parameters()) / 1e6
    device = infer_on if infer_on == train_on else f"{infer_on} / {train_on}"
    return Row(name, n, size, batch, build_s, forward, params, device=device)


def _on_a_device(run):
    """``run(options)`` on one simulated IPU (the default ``device="ipu_hw"``), or, where the
    program does not fit its memory (raised at compile, before anything runs), with
    ``device="cpu"`` (no IPU limits; the same kernels): (result, device)."""
    import popxl_fx
    from popxl_core.sim.oom import OutOfMemoryError

    try:
        return run(popxl_fx.Options()), "ipu_hw"
    except OutOfMemoryError:
        return run(popxl_fx.Options(device="cpu")), "cpu"


def _eager_steps(twin: nn.Module, x, y) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """2 SGD-momentum steps in train mode: the generator state before each, final weights."""
    twin.train()
    opt = torch.optim.SGD(twin.parameters(), lr=0.01, momentum=0.9)
    states = []
    for _ in range(2):
        states.append(torch.get_rng_state())
        loss = F.cross_entropy(twin(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return states, [p.detach() for p in twin.parameters()]


_HEADER = [
    "# torchvision classifiers on popxl_fx vs eager",
    "",
    "Random init, num_classes=10, dropout as built, batch 2 (4 or 8 where eager's own training",
    "diverges at 2: `_BATCH`, `measure`) at the smallest input; build =",
    "trace + lower + Session of the eval program and its first run (seconds, this host);",
    "forward: eval mode; parameters: after 2 SGD-momentum steps in train mode; peak: the",
    "measuring process's peak resident memory; device: `Options.device` for inference /",
    "training, `ipu_hw` (one simulated IPU, the default) or `cpu` where the program does not",
    "fit one IPU's memory (no IPU limit, the same kernels).",
    "Written by `python -m benchmarks.torchvision_table`, smallest model first.",
    "",
    "| model | params (M) | input | batch | build s | max fwd diff | max param diff (2 steps) "
    "| peak GiB | device |",
    "|---|---|---|---|---|---|---|---|---|",
]
_ROW = re.compile(r"^\| (\S+) \| ([\d.]+) \| (\d+) \| (\d+) \| ")


def _line(r: Row) -> str:
    if r.error:
        head = f"| {r.name} | {r.params_m:.2f} | {r.size} | {r.batch} |"
        return f"{head} - | {r.error} | - | {r.peak_gib:.1f} | - |"
    return (
        f"| {r.name} | {r.params_m:.2f} | {r.size} | {r.batch} | {r.build_s:.1f} | "
        f"{r.forward_diff:.3g} | {r.param_diff:.3g} | {r.peak_gib:.1f} | {r.device} |"
    )


def _markdown(lines: dict[str, str], skipped: dict[str, str], notes: list[str]) -> str:
    out = _HEADER + list(lines.values())
    if skipped:
        out += ["", "Not run here:", ""]
        out += [f"- {n}: {why}" for n, why in sorted(skipped.items())]
    if notes:
        out += [""] + notes
    return "\n".join(out) + "\n"


def _read(path: Path) -> tuple[dict[str, str], list[str]]:
    """The measured rows of an earlier output (name -> table line; failed rows are measured
    again) and its closing notes (the text after the table and the not-run list)."""
    if not path.exists():
        return {}, []
    rows, notes, in_notes = {}, [], False
    for line in path.read_text().splitlines():
        m = _ROW.match(line)
        if m and "Error" not in line and "error" not in line:
            rows[m.group(1)] = line
        elif in_notes:
            notes.append(line)
        elif line.startswith("Measured") or line.startswith("Notes"):
            in_notes, notes = True, [line]
    return rows, notes


def _error_text(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first[:160]}".replace("|", "/")


def _failed(name: str, error: str) -> Row:
    return Row(name, _param_count(name) / 1e6, input_size(name), 0, 0, 0, 0, error=error)


def _measure_here(name: str) -> Row:
    """``measure`` with a failure caught into the row, and this process's peak memory."""
    import resource

    try:
        row = measure(name)
    except Exception as exc:  # a failing builder is a row of the table, not the end of the run
        row = _failed(name, _error_text(exc))
    row.peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return row


def _measure_apart(name: str, timeout_s: float) -> Row:
    """``name`` measured in a child process: its memory goes back to the host after each
    builder, and a crash, a kill or a timeout is that row's error."""
    import json
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "benchmarks.torchvision_table", "--one", name]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return _failed(name, f"TimeoutExpired: over {timeout_s:.0f} s on this host")
    last = (done.stdout.strip().splitlines() or [""])[-1]
    if done.returncode == 0 and last.startswith("{"):
        return Row(**json.loads(last))
    tail = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    return _failed(
        name, f"ChildProcessError: exit {done.returncode}: {tail[:160]}".replace("|", "/")
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*")
    parser.add_argument("--families", action="store_true", help="one builder per family")
    parser.add_argument("--out", default=str(Path(__file__).with_name("TORCHVISION.md")))
    parser.add_argument("--resume", action="store_true", help="skip rows already measured")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per builder")
    parser.add_argument("--max-params", type=float, default=200, help="M params, run limit")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child: measure, print JSON
    args = parser.parse_args(argv)
    globals()["MAX_PARAMS"] = int(args.max_params * 1e6)  # too_large's limit for this run
    torch.set_num_threads(1)  # a shared host: one core per run, and reproducible timings
    if args.one:
        import dataclasses
        import json

        print(json.dumps(dataclasses.asdict(_measure_here(args.one))))
        return
    out = Path(args.out)
    lines, notes = _read(out)
    if not args.resume:
        lines = (
            {n: line for n, line in lines.items() if n not in set(args.models)}
            if args.models
            else {}
        )
    names = by_size(args.models or (FAMILY_SAMPLE if args.families else builders()))
    skipped = {n: too_large(n) for n in builders() if too_large(n) and n not in lines}
    for name in names:
        if name in skipped or name in lines:
            continue
        r = _measure_apart(name, args.timeout)
        lines[name] = _line(r)
        lines = {n: lines[n] for n in by_size(list(lines))}
        out.write_text(_markdown(lines, skipped, notes))  # so far: a long run can stop
        print(_line(r), flush=True)
    out.write_text(_markdown(lines, skipped, notes))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
