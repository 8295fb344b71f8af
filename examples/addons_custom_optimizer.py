"""Write your own optimiser as an `addons.Module` and train the MNIST classifier with it.

An optimiser is a module whose `build` updates one parameter in place:

* the parameter is a ``popxl.TensorByRef`` argument, so the in-place updates made in the
  subgraph reach the caller's variable;
* its state (moments, step count) are named inputs made with ``add_variable_input(...,
  by_ref=True)``: their factories create zero-filled variables in the main graph, one set per
  parameter, and the subgraph updates them in place too;
* the body is a chain of in-place ``popxl.ops.var_updates`` ops, so `build` runs under
  ``@popxl.in_sequence()``: the ops keep the order they are written in;
* ``cache=True`` makes `create_graph` return the *same* graph for parameters of the same shape
  and dtype, so eight parameters need only as many graphs as there are distinct shapes;
* a float hyper-parameter is baked into the graph; a Tensor one (the learning rate here)
  becomes a graph input, which the program feeds from a variable it can rewrite between steps.

The script checks three steps of the module against a numpy Adam, then trains the classifier
of ``addons_basics.py`` with it (learning rate decaying linearly to a tenth) and evaluates it.

Usage::

    python examples/addons_custom_optimizer.py --max-batches 300
"""

from __future__ import annotations

import time
from functools import partial
from itertools import islice

import numpy as np
from addons_basics import IMAGE_SHAPE, Classifier, evaluate  # the sibling example

import addons
import popxl_core as popxl
from addons.ops import cross_entropy_with_grad
from popxl_core import ops
from popxl_core.ops import var_updates
from popxl_fx.cli import add_data_args, data_kwargs, make_parser, non_negative_int, positive_int
from popxl_fx.data import get_data_loaders

F32 = np.float32


class Adam(addons.Module):
    """One Adam step on ``param``, in place: m and v are moving averages of the gradient and
    its square, and ``param -= lr * m_hat / (sqrt(v_hat) + eps)``.

    State, per parameter: ``m`` (``m_dtype``), ``v`` (float32) and, with bias correction,
    ``t`` (the float32 step count, which `adam_updater` increments).
    """

    @popxl.in_sequence()
    def build(
        self,
        param: popxl.TensorByRef,
        grad: popxl.Tensor,
        lr: float | popxl.Tensor,
        *,
        b1: float = 0.9,
        b2: float = 0.999,
        eps: float = 1e-8,
        m_dtype: popxl.dtype = popxl.float32,
        bias_correction: bool = True,
    ) -> None:
        zeros = partial(np.zeros, param.shape)
        m = self.add_variable_input("m", zeros, m_dtype, by_ref=True)
        v = self.add_variable_input("v", zeros, popxl.float32, by_ref=True)
        t = (
            self.add_variable_input("t", partial(np.zeros, ()), popxl.float32, by_ref=True)
            if bias_correction
            else None
        )
        var_updates.accumulate_moving_average_(m, grad, f=b1)
        var_updates.accumulate_moving_average_square_(v, grad, f=b2)
        direction = var_updates.adam_updater(m, v, time_step=t, beta1=b1, beta2=b2, epsilon=eps)
        ops.scaled_add_(param, direction, b=-lr)  # a Tensor lr is negated by a Neg op


def apply(optimiser: Adam, params: addons.NamedTensors, grads: dict, lr, **options) -> set:
    """Update every parameter with its own optimiser state; returns the graphs used."""
    graphs = set()
    for name, p in params.named_tensors.items():
        factories, graph = optimiser.create_graph(p, grads[p], lr, **options)
        state = factories.init(f"adam.{name}")
        graph.bind(state).call(p, grads[p], lr)
        graphs.add(graph.graph)
    return graphs


# A check against numpy --------------------------------------------------------------------
def numpy_adam(p, grads, lr, b1=0.9, b2=0.999, eps=1e-8):
    m = v = np.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        m = F32(b1) * m + (1 - F32(b1)) * g
        v = F32(b2) * v + (1 - F32(b2)) * g * g
        p = p - F32(lr) * (m / (1 - F32(b1) ** t)) / (np.sqrt(v / (1 - F32(b2) ** t)) + F32(eps))
    return p


def check_against_numpy(lr: float = 0.01, steps: int = 3) -> float:
    rng = np.random.default_rng(1)
    p0 = rng.normal(size=(3, 2)).astype(F32)
    grads = [rng.normal(size=(3, 2)).astype(F32) for _ in range(steps)]
    ir = popxl.Ir()
    with ir.main_graph:
        p = popxl.variable(p0, name="p")
        g_stream = popxl.h2d_stream(p.shape, popxl.float32, "grad")
        factories, graph = Adam().create_graph(p, p.spec, lr)
        print(graph.print_schedule())
        graph.bind(factories.init("adam")).call(p, ops.host_load(g_stream))
    session = popxl.Session(ir, "ipu_hw")
    with session:
        for g in grads:
            session.run({g_stream: g})
        got = session.get_tensor_data(p)
    err = float(np.abs(got - numpy_adam(p0, grads, lr)).max())
    print(f"{steps} Adam steps, max |simulator - numpy| = {err:.2e}")
    return err


# Training -----------------------------------------------------------------------------------
def training_program(batch: int, lr0: float, m_dtype: popxl.dtype):
    ir = popxl.Ir()
    with ir.main_graph:
        image_stream = popxl.h2d_stream((batch, *IMAGE_SHAPE), popxl.float32, "images")
        label_stream = popxl.h2d_stream((batch,), popxl.int32, "labels")
        images, labels = ops.host_load(image_stream), ops.host_load(label_stream)
        factories, forward = Classifier().create_graph(images)
        backward = addons.autodiff(forward)
        params = factories.init()
        lr = popxl.variable(np.array(lr0, F32), name="lr")  # rewritten by the schedule

        fwd_site = forward.bind(params).call_with_info(images)
        loss, dlogits = cross_entropy_with_grad(fwd_site.outputs[0], labels)
        info = backward.grad_graph_info
        bwd_site = backward.call_with_info(dlogits, args=info.inputs_dict(fwd_site))
        grads = info.fwd_parent_ins_to_grad_parent_outs(fwd_site, bwd_site)
        graphs = apply(Adam(cache=True), params, grads, lr, m_dtype=m_dtype)
        print(
            f"{len(params.tensors)} parameters updated by {len(graphs)} optimiser graphs "
            f"(one per distinct shape, thanks to cache=True); first moments in {m_dtype.name}"
        )

        loss_stream = popxl.d2h_stream(loss.shape, loss.dtype, "loss")
        ops.host_store(loss_stream, loss)
    session = popxl.Session(ir, "ipu_hw")
    return session, (image_stream, label_stream), params, loss_stream, lr


def train(args, loader):
    session, (image_stream, label_stream), params, loss_stream, lr = training_program(
        args.batch_size, args.lr, popxl.float16 if args.fp16_moments else popxl.float32
    )
    total = args.epochs * (min(len(loader), args.max_batches) if args.max_batches else len(loader))
    step, start = 0, time.perf_counter()
    with session:
        for epoch in range(args.epochs):
            for images, labels in islice(loader, args.max_batches or None):
                if step % 50 == 0:  # linear decay to lr/10, without rebuilding the program
                    session.write_variable_data(lr, F32(args.lr * (1 - 0.9 * step / total)))
                x = images.reshape(-1, *IMAGE_SHAPE).numpy()
                y = labels.numpy().astype(np.int32)
                loss = session.run({image_stream: x, label_stream: y})[loss_stream]
                step += 1
            print(f"epoch {epoch + 1}: last loss {float(loss):.4f}")
        trained = {t: a.copy() for t, a in session.get_tensors_data(params.tensors).items()}
    print(f"trained {step} steps ({step / (time.perf_counter() - start):.1f} it/s)")
    return trained, params


def main() -> None:
    ap = make_parser(__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=positive_int, default=1)
    ap.add_argument(
        "--max-batches",
        type=non_negative_int,
        default=0,
        help="stop each epoch (and the evaluation) after N batches; 0: all",
    )
    ap.add_argument("--batch-size", type=positive_int, default=16)
    ap.add_argument("--test-batch-size", type=positive_int, default=100)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument(
        "--fp16-moments",
        action="store_true",
        help="keep Adam's first moments in float16 (computed in float16)",
    )
    add_data_args(ap)
    args = ap.parse_args()
    args.outline = False  # the Classifier variant evaluate() rebuilds

    check_against_numpy()
    train_loader, test_loader = get_data_loaders(
        args.batch_size, args.test_batch_size, **data_kwargs(args)
    )
    trained, params = train(args, train_loader)
    accuracy = evaluate(args, test_loader, trained, params)
    print(f"test accuracy ({args.dataset}): {accuracy:.2f}%")


if __name__ == "__main__":
    main()
