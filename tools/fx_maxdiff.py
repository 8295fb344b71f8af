"""The per-model max difference table: 3 training steps on the simulator against eager.

For each zoo model (tests/fx_zoo.py), optimizer and way in, runs `assert_matches_eager` with
tolerances too loose to fail and prints the largest absolute difference of the losses, forward
outputs, gradients, final parameters and optimizer state (0.0 = bit for bit), and the time.

    python -m tools.fx_maxdiff seed_mlp gpt --via training_model
"""

from __future__ import annotations

import argparse
import sys
import time

from popxl_fx import Options
from popxl_fx.testing import assert_matches_eager

__all__ = ["main"]

KINDS = ("loss", "outputs", "gradients", "parameters", "optimizer state")


def main(argv=None) -> None:
    sys.path.insert(0, ".")
    from tests.fx_zoo import OPTIMIZERS, TORCHVISION, ZOO

    zoo = {**ZOO, **TORCHVISION}
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", choices=sorted(zoo))
    p.add_argument("--via", nargs="+", default=["training_model", "compile"])
    p.add_argument("--optimizer", nargs="+", default=["adamw", "sgd_momentum"])
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args(argv)
    print(
        f"{'model':16s} {'optimizer':13s} {'via':15s} "
        + " ".join(f"{k[:9]:>9s}" for k in KINDS)
        + "   time"
    )
    for name in a.models:
        for opt in a.optimizer:
            for via in a.via:
                case = zoo[name]()
                start = time.perf_counter()
                errors = assert_matches_eager(
                    case.model,
                    case.inputs,
                    targets=case.targets,
                    loss_fn=case.loss_fn,
                    optimizer=OPTIMIZERS[opt],
                    steps=a.steps,
                    options=Options(device="cpu"),
                    rtol=1e9,
                    atol=1e9,
                    via=via,
                )
                took = time.perf_counter() - start
                cols = " ".join(f"{errors.get(k, 0.0):9.2e}" for k in KINDS)
                print(f"{name:16s} {opt:13s} {via:15s} {cols} {took:6.1f}s", flush=True)


if __name__ == "__main__":
    main()
