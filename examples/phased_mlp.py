"""Phased execution of an MLP, end to end, against the same MLP trained unphased.

Phased: every layer's weights live in Streaming Memory (remote buffers). Training one batch
runs one *phase* per layer, forward then backward: load the layer's weights, run the layer
over the ``--micro-batches`` micro-batches of the batch (batch serialisation; activations
and their gradients go to remote buffers, one entry per layer and micro-batch), and in the
backward phase apply SGD to the mean gradient and store the weights back. The identical hidden
layers share one graph and one weight buffer (one entry each). At any time the chip holds
one layer's weights and one micro-batch's activations.

Unphased: the same network, all weights on chip, the whole batch in one forward and backward.

Both start from the same weights and see the same Fashion-MNIST batches; the script prints
their losses (equal up to float32 round-off: the phased mean gradient is a mean of
micro-batch means) and the on-chip memory each program needs, from each Session's report.

    python examples/phased_mlp.py --steps 10 --hidden-layers 6 --width 1024
"""

from __future__ import annotations

import argparse
from functools import partial

import numpy as np

import addons
import popxl_core as popxl
from addons.remote import load_remote_graph, named_variable_buffers, store_remote_graph
from popxl_core import ops
from popxl_fx.data import get_data_loaders

IN, CLASSES = 28 * 28, 10


class Dense(addons.Module):
    """x @ weight + bias, then gelu (except for the logits)."""

    def __init__(self, out_features: int, gelu: bool = True) -> None:
        super().__init__()
        self.out_features, self.gelu = out_features, gelu

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        shape = (x.shape[-1], self.out_features)
        w = self.add_variable_input("weight", partial(np.random.normal, 0, 0.02, shape), x.dtype)
        b = self.add_variable_input("bias", partial(np.zeros, self.out_features), x.dtype)
        y = x @ w + b
        return ops.gelu(y) if self.gelu else y


class Head(addons.Module):
    """The logits layer, the loss and the logits layer's backward, in one graph."""

    def build(self, x: popxl.Tensor, labels: popxl.Tensor):
        facts, fwd = Dense(CLASSES, gelu=False).create_graph(x.spec)
        grad_facts, bwd = addons.autodiff_with_accumulation(
            fwd, fwd.args.tensors, grads_required=fwd.graph.inputs[:1]
        )
        info = fwd.bind(self.add_variable_inputs("fwd", facts)).call_with_info(x)
        loss, dlogits = addons.cross_entropy_with_grad(info.parent_output(0), labels)
        bwd_vars = self.add_variable_inputs("bwd", grad_facts)
        (dx,) = bwd.bind(bwd_vars).call(dlogits, args=bwd.grad_graph_info.inputs_dict(info))
        return dx, loss


# the phased program ----------------------------------------------------------------------------
class Phases:
    """One layer type: its batch-serialised forward and backward, weight buffer (``rows``
    entries, one per layer of this type) and the graphs that load and store its weights."""

    def __init__(self, module, rows: int, micro: int, *specs) -> None:
        self.facts, fwd = module.create_graph(*specs)
        self.fwd, self.bwd, self.grad_facts = fwd, None, None
        self.fwd_vars = self.facts if not isinstance(module, Head) else self.facts.fwd
        self.buffers = named_variable_buffers(self.fwd_vars, rows)
        self.load, self.names = load_remote_graph(self.buffers, rows)
        self.store = store_remote_graph(self.buffers, rows)
        self.micro = micro

    def differentiate(self, first: bool) -> None:
        self.grad_facts, self.bwd = addons.autodiff_with_accumulation(
            self.fwd,
            self.fwd.args.tensors,
            grads_required=() if first else self.fwd.graph.inputs[:1],
        )

    def load_weights(self, row: int) -> addons.NamedTensors:
        return addons.NamedTensors.pack(self.names, self.load.call(row))

    def sgd_and_store(self, weights, grads, counter, row: int, lr: float) -> None:
        for key, w in weights.to_dict().items():
            ops.scaled_add_(w, grads.to_dict()[key], b=-lr)
        ops.var_updates.accumulator_scale_(counter, 0.0)
        self.store.bind(weights).call(row)


def build_phased(hidden: int, width: int, micro: int, n_micro: int, lr: float):
    ir = popxl.Ir()
    steps, rows = n_micro, hidden  # buffer rows: one per layer feeding the next
    with ir.main_graph, popxl.in_sequence(True):
        img = popxl.h2d_stream((micro, IN), popxl.float32, "image")
        lbl = popxl.h2d_stream((micro,), popxl.int32, "labels")
        loss_stream = popxl.d2h_stream((), popxl.float32, "loss")
        x_spec = popxl.TensorSpec((micro, width), popxl.float32)
        first = Phases(Dense(width), 1, micro, img.spec)
        inner = Phases(Dense(width), hidden - 1, micro, x_spec) if hidden > 1 else None
        head = Phases(Head(), 1, micro, x_spec, lbl.spec)
        first.differentiate(first=True)
        if inner:
            inner.differentiate(first=False)
        xs = addons.batch_serial_buffer(first.fwd.graph.outputs[0], steps, rows)
        dxs = addons.batch_serial_buffer(first.fwd.graph.outputs[0], steps, rows)
        bs = partial(
            addons.batch_serialise_fwd_and_grad, steps=steps, store_streams={}, io_mode="io"
        )
        f_fwd, f_bwd = bs(
            first.fwd,
            first.bwd,
            first.fwd.args,
            load_handles={first.fwd.graph.inputs[0]: img, first.bwd.graph.inputs[0]: (dxs, 0)},
            store_buffers={first.fwd.graph.outputs[0]: (xs, 0)},
        )
        if inner:
            i_fwd, i_bwd = bs(
                inner.fwd,
                inner.bwd,
                inner.fwd.args,
                load_handles={
                    inner.fwd.graph.inputs[0]: (xs, 0),
                    inner.bwd.graph.inputs[0]: (dxs, 1),
                },
                store_buffers={
                    inner.fwd.graph.outputs[0]: (xs, 1),
                    inner.bwd.graph.outputs[0]: (dxs, 0),
                },
                rows=hidden - 1,
            )
        h = head.fwd.graph
        h_bs = addons.batch_serialise(
            head.fwd,
            steps,
            {h.inputs[0]: (xs, hidden - 1), h.inputs[1]: lbl},
            {h.outputs[1]: loss_stream},
            {h.outputs[0]: (dxs, hidden - 1)},
            io_mode="io",
        )
        weights = {"fc0": first.facts.init_remote(first.buffers, 0, "fc0")}
        for i in range(1, hidden):
            weights[f"fc{i}"] = inner.facts.init_remote(inner.buffers, i - 1, f"fc{i}")
        weights["head"] = head.fwd_vars.init_remote(head.buffers, 0, "head")

        def forward(layer: Phases, graph, row: int) -> None:
            graph.bind(layer.load_weights(row)).call(row)

        def backward(layer: Phases, graph, row: int) -> None:
            w = layer.load_weights(row)
            grads = layer.grad_facts.init_zero()
            both = grads.copy()
            both.update(w.copy())
            graph.bind(both).call(row)
            layer.sgd_and_store(w, grads.accum, grads.mean_accum_counter, row, lr)

        # seven-phase shape: forwards, the head (forward, loss, backward), backwards
        forward(first, f_fwd.graph, 0)
        for r in range(hidden - 1):
            forward(inner, i_fwd.graph, r)
        hw = head.load_weights(0)
        hg = head.facts.bwd.init_zero()
        h_bs.graph.bind(addons.NamedTensors(fwd=hw, bwd=hg)).call(0)
        head.sgd_and_store(hw, hg.accum, hg.mean_accum_counter, 0, lr)
        for r in reversed(range(hidden - 1)):
            backward(inner, i_bwd.graph, r)
        backward(first, f_bwd.graph, 0)
    ir.num_host_transfers = steps
    return ir, (img, lbl), weights, loss_stream


# the unphased program --------------------------------------------------------------------------
class Mlp(addons.Module):
    def __init__(self, hidden: int, width: int) -> None:
        super().__init__()
        self.hidden = hidden
        for i in range(hidden):
            setattr(self, f"fc{i}", Dense(width))  # submodules: variables fc{i}.weight, ...
        self.head = Dense(CLASSES, gelu=False)

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        for i in range(self.hidden):
            x = getattr(self, f"fc{i}")(x)
        return self.head(x)


def build_unphased(hidden: int, width: int, batch: int, lr: float):
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence(True):
        img = popxl.h2d_stream((batch, IN), popxl.float32, "image")
        lbl = popxl.h2d_stream((batch,), popxl.int32, "labels")
        x, labels = ops.host_load(img), ops.host_load(lbl)
        facts, fwd = Mlp(hidden, width).create_graph(x)
        bwd = addons.autodiff(fwd, grads_required=fwd.args.tensors)
        weights = facts.init()
        info = fwd.bind(weights).call_with_info(x)
        loss, dlogits = addons.cross_entropy_with_grad(info.parent_output(0), labels)
        grad_info = bwd.call_with_info(dlogits, args=bwd.grad_graph_info.inputs_dict(info))
        grads = bwd.grad_graph_info.fwd_parent_ins_to_grad_parent_outs(info, grad_info)
        for w in weights.tensors:
            ops.scaled_add_(w, grads[w], b=-lr)
        loss_stream = popxl.d2h_stream((), popxl.float32, "loss")
        ops.host_store(loss_stream, loss)
    return ir, (img, lbl), weights, loss_stream


# running both ----------------------------------------------------------------------------------
def _same_start(phased_session, phased_w, plain_session, plain_w) -> None:
    """Copy the phased program's initial weights into the unphased one (keys match:
    fc0..fc{n-1} and head; the phased head's weights sit under head.fwd-less keys)."""
    src = {k: t for k, t in _flat(phased_w).items()}
    data = phased_session.get_tensors_data(list(src.values()))
    plain = plain_w.to_dict()
    plain_session.write_variables_data({plain[k]: data[t].copy() for k, t in src.items()})


def _flat(weights: dict) -> dict:
    return {f"{name}.{k}": t for name, tree in weights.items() for k, t in tree.to_dict().items()}


def on_chip(session: popxl.Session) -> str:
    m = session.report.plan.memory[0]
    return (
        f"variables {m.variables / 2**20:7.2f} MiB, activations peak "
        f"{m.activations / 2**20:6.2f} MiB, total {m.total / 2**20:7.2f} MiB"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden-layers", type=int, default=6)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--data-dir", default=None)
    args = ap.parse_args()
    if args.hidden_layers < 1:
        raise SystemExit("--hidden-layers must be at least 1")
    np.random.seed(0)
    micro, n = args.micro_batch, args.micro_batches
    p_ir, (p_img, p_lbl), p_w, p_loss = build_phased(
        args.hidden_layers, args.width, micro, n, args.lr
    )
    u_ir, (u_img, u_lbl), u_w, u_loss = build_unphased(
        args.hidden_layers, args.width, micro * n, args.lr
    )
    phased, plain = popxl.Session(p_ir, "ipu_hw"), popxl.Session(u_ir, "ipu_hw")
    _same_start(phased, p_w, plain, u_w)
    train, _ = get_data_loaders(micro * n, 100, data_dir=args.data_dir)
    worst = 0.0
    with phased, plain:
        for step, (images, labels) in enumerate(train):
            if step == args.steps:
                break
            x = images.reshape(micro * n, IN).numpy()
            y = labels.numpy().astype(np.int32)
            lp = float(
                np.mean(
                    phased.run({p_img: x.reshape(n, micro, IN), p_lbl: y.reshape(n, micro)})[p_loss]
                )
            )
            lu = float(plain.run({u_img: x, u_lbl: y})[u_loss])
            worst = max(worst, abs(lp - lu))
            print(f"step {step:3d}  loss phased {lp:.6f}  unphased {lu:.6f}")
    print(f"worst loss difference: {worst:.2e} (float32 round-off)")
    print(f"on-chip memory (IPU 0, estimate): phased   {on_chip(phased)}")
    print(f"                                  unphased {on_chip(plain)}")


if __name__ == "__main__":
    main()
