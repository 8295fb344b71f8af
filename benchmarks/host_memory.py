"""Peak host memory of training a GPT: eager PyTorch beside popxl_fx plain and phased.

Each configuration trains the GPT-style decoder of ``examples/fx_phased.py`` (``--layers``
blocks of width ``--width``, vocabulary ``--vocab``, AdamW, batch ``--batch`` x ``--context``)
for ``--steps`` steps in a fresh subprocess (``device="cpu"`` for popxl_fx), so that no run
inherits another's heap. Printed per configuration: the peak resident memory above the
process's resident memory once the torch model is made (its weights included there), that
peak as a multiple of the weight bytes, and its ratio to eager's. ``phased_rts2`` (asked for
with ``--configs``) is phased with replicated tensor sharding over 2 replicas. The default
is the 97.6 M-parameter GPT of issue 38 (12 x 768, vocabulary 8192, 64 tokens); ``--small``
is a 4 x 256 GPT for a quick run.

    python benchmarks/host_memory.py --small
    python benchmarks/host_memory.py --configs eager phased phased_rts2
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import popxl_fx
from examples.fx_phased import Decoder

__all__ = ["CONFIGS", "main", "measure"]

CONFIGS = {
    "eager": None,
    "plain": dict(device="cpu"),
    "phased": dict(device="cpu", phased_execution="blocks"),
    "phased_rts2": dict(
        device="cpu",
        phased_execution="blocks",
        replication_factor=2,
        replicated_tensor_sharding=True,
    ),
}
_GIB = float(1 << 30)


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
    return 0


def _peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10


def _step_fn(config: str, model: torch.nn.Module):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if CONFIGS[config] is None:

        def step(x, y):
            opt.zero_grad()
            loss = model(x, y)
            loss.backward()
            opt.step()
            return float(loss)

        return step
    options = popxl_fx.Options(**CONFIGS[config])
    return popxl_fx.training_model(model, opt, options=options)


def measure(config: str, args: argparse.Namespace) -> dict:
    """One configuration in this process: ``{"weights": bytes, "above": peak - baseline}``."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = Decoder(args.vocab, args.context, args.width, args.width // 64, args.layers)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    g = torch.Generator().manual_seed(1)
    shape = (args.batch, args.context)
    batches = [(torch.randint(0, args.vocab, shape, generator=g),) * 2 for _ in range(args.steps)]
    base = _rss_bytes()
    step = _step_fn(config, model)
    losses = [float(step(x, y)) for x, y in batches]
    return {"weights": weights, "above": _peak_bytes() - base, "losses": losses}


def _child(config: str, argv: list[str]) -> dict:
    cmd = [sys.executable, __file__, "--one", config, *argv]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{config} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _table(rows: dict) -> str:
    eager = rows.get("eager", {}).get("above")
    lines = [f"{'config':<12} {'peak above model':>17} {'x weights':>10} {'x eager':>8}"]
    for name, r in rows.items():
        ratio = f"{r['above'] / eager:8.2f}" if eager else f"{'-':>8}"
        lines.append(
            f"{name:<12} {r['above'] / _GIB:13.3f} GiB {r['above'] / r['weights']:10.2f} {ratio}"
        )
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=[*CONFIGS][:3], choices=list(CONFIGS))
    ap.add_argument("--one", choices=list(CONFIGS), help=argparse.SUPPRESS)
    ap.add_argument("--small", action="store_true", help="4 blocks x 256, vocabulary 2048")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    return ap


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    if args.small:
        args.layers, args.width, args.vocab = 4, 256, 2048
    if args.one is not None:
        print(json.dumps(measure(args.one, args)))
        return {}
    rest = [a for a in argv if a != "--configs" and a not in CONFIGS]
    rows = {c: _child(c, rest) for c in args.configs}
    params = rows[args.configs[0]]["weights"] // 4
    print(
        f"GPT {args.layers} x {args.width}, {params / 1e6:.1f} M parameters, AdamW, "
        f"batch {args.batch} x {args.context}, {args.steps} steps, device='cpu'"
    )
    print(_table(rows))
    return rows


if __name__ == "__main__":
    main()
