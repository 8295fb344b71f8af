"""How fast and in how much host memory a GPT too big for one IPU reaches its OOM error.

The GPT-style decoder of ``examples/fx_phased.py`` (``--layers`` blocks of width ``--width``,
AdamW; 24 x 1024 is about 300 M float32 parameters, 1.2 GB of torch weights) is built for
``device="ipu_hw"`` at a tiny batch: the build stops at the simulator's plan with the
per-module OOM table, before any step. Printed: the seconds from ``trainer.build`` to the
error, and the process's resident memory before (torch model made) and at its highest (the
peak beyond the torch model is what the build costs on the host). ``--what-if`` times one
weightless what-if plan (what ``memory="auto"`` does per candidate) instead.

    python benchmarks/gpt_oom.py --layers 24 --width 1024
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import popxl_fx
from examples.fx_phased import Decoder


def _rss_gib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / (1 << 20)
    return 0.0


def _peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=16)
    ap.add_argument("--what-if", action="store_true")
    ap.add_argument("--profile", choices=("cumulative", "tottime"), help="cProfile, sorted so")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (as the tests)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = Decoder(256, args.context, args.width, args.width // 64, args.layers)
    params = sum(p.numel() for p in model.parameters())
    x = torch.randint(0, 256, (args.batch, args.context))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    trainer = popxl_fx.training_model(model, opt, options=popxl_fx.Options())
    base = _rss_gib()
    start = time.perf_counter()
    prof = None
    if args.profile is not None:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    message = ""
    try:
        if args.what_if:
            sig = (popxl_fx.program.signature_of(model, (x, x)), None)
            message = str(trainer._what_if(sig, (x, x), trainer.options).peak)
        else:
            trainer.build(x, x)
    except MemoryError as e:
        message = str(e)
    seconds = time.perf_counter() - start
    if prof is not None:
        import pstats

        prof.disable()
        pstats.Stats(prof).sort_stats(args.profile).print_stats(45)
    out = {
        "parameters": params,
        "seconds": seconds,
        "rss_before_gib": base,
        "peak_beyond_model_gib": _peak_gib() - base,
    }
    print(message[:3000])
    print(
        f"{params / 1e6:.0f} M parameters: {'what-if plan' if args.what_if else 'OOM error'} "
        f"in {seconds:.2f} s; resident {base:.2f} GiB with the torch model, peak "
        f"+{out['peak_beyond_model_gib']:.2f} GiB beyond it"
    )
    return out


if __name__ == "__main__":
    main()
