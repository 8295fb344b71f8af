"""addons in five steps, ending with an MNIST classifier trained on the simulated IPU.

1. **A layer is an `addons.Module`.** Its `build` declares the variables it needs with
   `add_variable_input` (a graph input plus a *factory* that knows how to make the variable)
   and computes with popxl ops. `create_graph` traces `build` once and returns the factories
   and a `GraphWithNamedArgs`.
2. **Factories make variables, `bind` attaches them.** In the main graph, `factories.init()`
   creates one set of variables; `graph.bind(variables)` gives a `BoundGraph` that is called
   with the data only. One graph can be bound to several sets of variables.
3. **Names are a `DotTree`.** Factories, variables and graph inputs are all addressed by dotted
   keys (``hidden0.w``), so two trees with the same keys line up with `to_mapping`.
4. **Inlined vs outlined.** Calling a submodule inside `build` copies its ops into the parent
   graph; `call_module` on one cached module instead builds its graph once and calls it for
   every layer, with separate variables (see the two schedules this script prints).
5. **Training.** `addons.autodiff` gives the backward graph; SGD is one `scaled_add_` per
   variable; a second, forward-only program receives the trained weights and is evaluated.

Usage::

    python examples/addons_basics.py --max-batches 200 --epochs 1
"""

from __future__ import annotations

import time
from functools import partial
from itertools import islice

import numpy as np

import addons
import popxl_core as popxl
from addons.ops import cross_entropy_with_grad
from popxl_core import ops
from popxl_fx.cli import add_data_args, data_kwargs, make_parser, non_negative_int, positive_int
from popxl_fx.data import get_data_loaders

RNG = np.random.default_rng(0)  # draws every initial weight, in creation order
IMAGE_SHAPE = (28, 28)


class Dense(addons.Module):
    """``activation(x @ w + b)``; w ~ N(0, std^2), b = 0. ``cache=True`` reuses the graph."""

    def __init__(
        self, features: int, activation=None, std: float = 0.02, cache: bool = False
    ) -> None:
        super().__init__(cache=cache)
        self.features, self.activation, self.std = features, activation, std

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        shape = (x.shape[-1], self.features)
        w = self.add_variable_input("w", partial(RNG.normal, 0.0, self.std, shape), x.dtype)
        b = self.add_variable_input("b", partial(np.zeros, (self.features,)), x.dtype)
        y = x @ w + b
        return self.activation(y) if self.activation is not None else y


class Classifier(addons.Module):
    """Flatten, ``1 + depth`` gelu layers of ``width``, then a linear layer to ``classes``.

    With ``outline=True`` the ``depth`` hidden layers (all width x width) share one subgraph.
    Both variants name their variables alike (``first.w``, ``hidden0.w``, ..., ``out.b``).
    """

    def __init__(
        self, width: int = 256, depth: int = 2, classes: int = 10, outline: bool = False
    ) -> None:
        super().__init__()
        self.depth, self.outline = depth, outline
        self.first = Dense(width, ops.gelu)
        if outline:
            # An underscore keeps it out of the submodule tree: its variables are added per
            # call site by call_module, under the name given there.
            self._hidden = Dense(width, ops.gelu, cache=True)
        else:
            for i in range(depth):
                setattr(self, f"hidden{i}", Dense(width, ops.gelu))
        self.out = Dense(classes)

    def build(self, images: popxl.Tensor) -> popxl.Tensor:
        x = self.first(images.reshape((images.shape[0], -1)))
        for i in range(self.depth):
            if self.outline:
                (x,) = self.call_module(self._hidden, name=f"hidden{i}")(x)
            else:
                x = getattr(self, f"hidden{i}")(x)
        return self.out(x)


# 1-3: modules, factories, bound graphs, names ------------------------------------------------
def tour() -> None:
    ir = popxl.Ir()
    with ir.main_graph:
        factories, graph = Dense(3, ops.gelu).create_graph(popxl.TensorSpec((2, 4), popxl.float32))
        print("factories of Dense(3):", sorted(factories.to_dict()))
        print(graph.print_schedule())

        first, second = factories.init("first"), factories.init("second")
        x = popxl.constant(np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4), name="x")
        streams = {}
        for name, variables in (("first", first), ("second", second)):
            (y,) = graph.bind(variables).call(x)  # the same graph, other variables
            streams[name] = popxl.d2h_stream(y.shape, y.dtype, name)
            ops.host_store(streams[name], y)

        tree = addons.NamedTensors()
        tree.insert("layer_a", first)
        tree.insert("layer_b", second)
        print("nested keys:", tree.keys(), "->", sorted(tree.to_dict()))
        print("tree.layer_a.w is the variable", tree.layer_a.w.name)
        pairs = first.to_mapping(second)  # same keys -> {first's tensor: second's tensor}
        print("to_mapping:", sorted((a.name, b.name) for a, b in pairs.items()))

    session = popxl.Session(ir, "ipu_hw")
    with session:
        out = session.run()
    print(
        "one graph, two weight sets, two results differ:",
        not np.allclose(out[streams["first"]], out[streams["second"]]),
    )


# 4: inlined vs outlined --------------------------------------------------------------------
def schedules() -> None:
    ir = popxl.Ir()
    spec = popxl.TensorSpec((4, *IMAGE_SHAPE), popxl.float32)
    with ir.main_graph:
        for outline in (False, True):
            factories, graph = Classifier(width=64, depth=2, outline=outline).create_graph(spec)
            kind = "outlined" if outline else "inlined"
            print(f"\n{kind}: {len(graph.graph.ops)} ops, variables {sorted(factories.to_dict())}")
            print(graph.print_schedule())


# 5: training and validation ----------------------------------------------------------------
def training_program(batch: int, lr: float, outline: bool):
    """One SGD step per run: forward, loss and its gradient, backward, update, store the loss."""
    ir = popxl.Ir()
    with ir.main_graph:
        image_stream = popxl.h2d_stream((batch, *IMAGE_SHAPE), popxl.float32, "images")
        label_stream = popxl.h2d_stream((batch,), popxl.int32, "labels")
        images, labels = ops.host_load(image_stream), ops.host_load(label_stream)

        factories, forward = Classifier(outline=outline).create_graph(images)
        backward = addons.autodiff(forward)  # before any call: it adds forward outputs
        params = factories.init()

        fwd_site = forward.bind(params).call_with_info(images)
        loss, dlogits = cross_entropy_with_grad(fwd_site.outputs[0], labels)
        info = backward.grad_graph_info
        bwd_site = backward.call_with_info(dlogits, args=info.inputs_dict(fwd_site))
        grads = info.fwd_parent_ins_to_grad_parent_outs(fwd_site, bwd_site)
        for p in params.tensors:
            ops.scaled_add_(p, grads[p], b=-lr)

        loss_stream = popxl.d2h_stream(loss.shape, loss.dtype, "loss")
        ops.host_store(loss_stream, loss)
    return popxl.Session(ir, "ipu_hw"), (image_stream, label_stream), params, loss_stream


def inference_program(batch: int, outline: bool):
    ir = popxl.Ir()
    with ir.main_graph:
        image_stream = popxl.h2d_stream((batch, *IMAGE_SHAPE), popxl.float32, "images")
        images = ops.host_load(image_stream)
        factories, forward = Classifier(outline=outline).create_graph(images)
        params = factories.init()
        (logits,) = forward.bind(params).call(images)
        logits_stream = popxl.d2h_stream(logits.shape, logits.dtype, "logits")
        ops.host_store(logits_stream, logits)
    return popxl.Session(ir, "ipu_hw"), image_stream, params, logits_stream


def _host(images, labels) -> tuple[np.ndarray, np.ndarray]:
    return images.reshape(-1, *IMAGE_SHAPE).numpy(), labels.numpy().astype(np.int32)


def train(args, loader) -> tuple[dict, addons.NamedTensors]:
    session, (image_stream, label_stream), params, loss_stream = training_program(
        args.batch_size, args.lr, args.outline
    )
    steps, start = 0, time.perf_counter()
    with session:
        for epoch in range(args.epochs):
            for images, labels in islice(loader, args.max_batches or None):
                x, y = _host(images, labels)
                loss = session.run({image_stream: x, label_stream: y})[loss_stream]
                steps += 1
            print(f"epoch {epoch + 1}: last loss {float(loss):.4f}")
        trained = session.get_tensors_data(params.tensors)
    rate = steps / (time.perf_counter() - start)
    print(f"trained {steps} steps ({rate:.1f} it/s)")
    return {t: a.copy() for t, a in trained.items()}, params


def evaluate(args, loader, trained: dict, train_params: addons.NamedTensors) -> float:
    session, image_stream, params, logits_stream = inference_program(
        args.test_batch_size, args.outline
    )
    # Both programs use the same keys, so the trained arrays reach the right variables.
    session.write_variables_data(
        {test_t: trained[train_t] for train_t, test_t in train_params.to_mapping(params).items()}
    )
    correct = seen = 0
    with session:
        for images, labels in islice(loader, args.max_batches or None):
            x, y = _host(images, labels)
            logits = session.run({image_stream: x})[logits_stream]
            correct += int((logits.argmax(-1) == y).sum())
            seen += len(y)
    return 100.0 * correct / seen


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
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--outline", action="store_true", help="train the outlined Classifier")
    add_data_args(ap)
    args = ap.parse_args()

    tour()
    schedules()
    train_loader, test_loader = get_data_loaders(
        args.batch_size, args.test_batch_size, **data_kwargs(args)
    )
    trained, params = train(args, train_loader)
    accuracy = evaluate(args, test_loader, trained, params)
    print(f"test accuracy ({args.dataset}): {accuracy:.2f}%")


if __name__ == "__main__":
    main()
