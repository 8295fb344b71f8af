"""The per-step cost of issue 17's torch-side checks beside the whole training step.

A trainer's step first checks what its program depends on (`popxl_fx.torch_state`: the
`structure_key` of the model and optimizer, the input signature, then `SharedState`'s
`before_step`/`after_step` looking for replaced storage, changed copies and a loaded optimizer
state). Here those checks are timed alone, on the trainer's own objects, and beside the full
step of the seed MLP (784-512-512-512-10) at batch 8, median of ``--repeats`` after a warm-up.
Target: the checks under 2 % of the step.

    python -m benchmarks.truth_check --repeats 200
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.cases import seed_mlp
from popxl_fx.program import signature_of
from popxl_fx.torch_structure import structure_key

__all__ = ["main", "measure"]


def _median(fn, repeats: int, inner: int = 1) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - start) / inner)
    return statistics.median(times)


def measure(optimizer: str, repeats: int, warmup: int = 10) -> dict[str, float]:
    """Seconds per call of the whole step and of the per-step checks alone."""
    case = seed_mlp(8, optimizer)
    trainer, inputs = case.trainer, case.inputs
    for _ in range(warmup):
        case.sim()
    model, opt = trainer._model, trainer.optimizer
    shared = trainer._active.extra["shared"]

    def checks() -> None:
        structure = structure_key(model, opt)
        trainer._programs.get((signature_of(model, inputs), structure), None)
        shared.before_step(structure)
        shared.after_step()

    step = _median(case.sim, repeats)
    check = _median(checks, repeats, inner=20)
    return {"step": step, "checks": check}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print("| case | step | per-step checks | checks / step | target |")
    print("|---|---|---|---|---|")
    for optimizer in ("sgd", "adam"):
        t = measure(optimizer, args.repeats)
        print(
            f"| mlp_{optimizer}_b8 | {t['step'] * 1e3:.3f} ms | {t['checks'] * 1e6:.1f} us | "
            f"{100 * t['checks'] / t['step']:.2f} % | < 2 % |"
        )


if __name__ == "__main__":
    main()
