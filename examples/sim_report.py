"""What the simulator says a program costs on an IPU, and what outlining saves.

The network is the 784-512-512-512-10 MNIST MLP of the addons basics tutorial, built twice
with this project's `Classifier` (examples/addons_basics.py): once with its two 512 x 512
hidden layers inlined, once outlined (one subgraph called for both). Each training step
(forward, cross entropy, backward, SGD) gets a Session on "ipu_hw"; the script prints

* the report of the outlined program: memory per IPU, time per step (an estimate with fixed
  costs fitted to Graphcore's published timings), traffic, and the program tree;
* ``inlined.diff(outlined)``: the same variables and activations, the hidden layer's code
  counted once instead of twice;
* that both programs compute the same loss from the same weights (outlining changes where code
  lives, not the numbers);

and writes the liveness plot of the outlined step (with matplotlib: the ``plot`` extra) and
both JSON reports to ``--out``. Phasing (the phased-execution tutorial, seed 003) shows in the
same way in examples/phased_report.py.

Usage::

    python examples/sim_report.py --out sim_report_out
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from addons_basics import Classifier

import addons
import popxl_core as popxl
from addons.ops import cross_entropy_with_grad
from popxl_core import ops

BATCH, LR = 8, 0.05


def training_step(outline: bool):
    """One SGD step of the 784-512-512-512-10 classifier per `Session.run`."""
    ir = popxl.Ir()
    with ir.main_graph:
        image_stream = popxl.h2d_stream((BATCH, 28, 28), popxl.float32, "images")
        label_stream = popxl.h2d_stream((BATCH,), popxl.int32, "labels")
        images, labels = ops.host_load(image_stream), ops.host_load(label_stream)
        net = Classifier(width=512, depth=2, outline=outline)
        factories, forward = net.create_graph(images)
        backward = addons.autodiff(forward)
        params = factories.init()
        fwd = forward.bind(params).call_with_info(images)
        loss, dlogits = cross_entropy_with_grad(fwd.outputs[0], labels)
        info = backward.grad_graph_info
        bwd = backward.call_with_info(dlogits, args=info.inputs_dict(fwd))
        grads = info.fwd_parent_ins_to_grad_parent_outs(fwd, bwd)
        for p in params.tensors:
            ops.scaled_add_(p, grads[p], b=-LR)
        loss_stream = popxl.d2h_stream(loss.shape, loss.dtype, "loss")
        ops.host_store(loss_stream, loss)
    session = popxl.Session(ir, "ipu_hw")
    return session, (image_stream, label_stream), params, loss_stream


def same_loss(inlined, outlined) -> tuple[float, float]:
    """Copy the inlined program's weights into the outlined one; run both on one batch."""
    (s_in, streams_in, p_in, loss_in), (s_out, streams_out, p_out, loss_out) = inlined, outlined
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 1, (BATCH, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, BATCH).astype(np.int32)
    s_out.write_variables_data(
        {p_out.to_dict()[k]: s_in.get_tensor_data(t) for k, t in p_in.to_dict().items()}
    )
    losses = []
    for session, streams, loss_stream in (
        (s_in, streams_in, loss_in),
        (s_out, streams_out, loss_out),
    ):
        with session:
            losses.append(float(session.run(dict(zip(streams, (x, y))))[loss_stream]))
    return losses[0], losses[1]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("sim_report_out"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    inlined, outlined = training_step(outline=False), training_step(outline=True)
    r_in, r_out = inlined[0].report, outlined[0].report
    print("== outlined training step ==")
    print(r_out.summary())
    print("\nprogram tree:\n" + r_out.program_tree())
    print("\n== inlined vs outlined ==")
    diff = r_in.diff(r_out, ("inlined", "outlined"))
    print(diff)
    saved = diff["code_bytes"][0] - diff["code_bytes"][1]
    print(f"outlining saves {saved:,} B of code per IPU; variables and activations are the same")

    a, b = same_loss(inlined, outlined)
    print(f"loss from the same weights and batch: inlined {a:.6f}, outlined {b:.6f}")

    r_in.to_json(args.out / "inlined.json")
    r_out.to_json(args.out / "outlined.json")
    try:
        png = r_out.plot_liveness(
            args.out / "liveness_outlined.png",
            title="Outlined MNIST training step on ipu_hw (estimate)",
        )
        print(f"liveness plot: {png}")
    except ImportError as e:
        print(f"no liveness plot: {e}")
    print(f"reports: {args.out}/inlined.json, {args.out}/outlined.json")


if __name__ == "__main__":
    main()
