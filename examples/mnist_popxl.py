"""Train a two-layer network on (Fashion-)MNIST with hand-written PopXL on the simulated IPU.

The network is ``gelu(gelu(x @ W0 + b0) @ W1 + b1)``: each layer is a `popxl.Module` traced
into its own subgraph, differentiated with `popxl.transforms.autodiff` and called with
`ops.call_with_info`; the loss is softmax + NLL and the update is plain SGD. The same network is
trained beside it in eager PyTorch from the same initial weights on the same batches, and both
test accuracies are printed, followed by the simulator's memory and cycle report.

Usage::

    python examples/mnist_popxl.py --max-steps 300
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

import popxl_core as popxl
from popxl_core import ops, transforms
from popxl_fx.cli import add_data_args, data_kwargs, make_parser, positive_int
from popxl_fx.data import get_data_loaders

IMAGE, HIDDEN, CLASSES = 28 * 28, 32, 10
Batch = tuple[np.ndarray, np.ndarray]  # float32 [B, 784] images, int32 [B] labels
StepFn = Callable[[np.ndarray, np.ndarray], float]
PredictFn = Callable[[np.ndarray], np.ndarray]


class Linear(popxl.Module):
    """``gelu(x @ W + b)``; W and b are graph inputs, bound to variables at each call site."""

    def __init__(self) -> None:
        self.W: popxl.Tensor | None = None
        self.b: popxl.Tensor | None = None

    def build(self, x: popxl.Tensor, out_features: int) -> popxl.Tensor:
        self.W = popxl.graph_input((x.shape[-1], out_features), popxl.float32, "W")
        self.b = popxl.graph_input((out_features,), popxl.float32, "b")
        return ops.gelu(x @ self.W + self.b)


def init_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """Small normal initial weights, shared by the PopXL and the eager PyTorch network."""
    rng = np.random.default_rng(seed)
    shapes = {"W0": (IMAGE, HIDDEN), "b0": (HIDDEN,), "W1": (HIDDEN, CLASSES), "b1": (CLASSES,)}
    return {k: rng.normal(0.0, 0.02, s).astype(np.float32) for k, s in shapes.items()}


# PopXL ---------------------------------------------------------------------------------------
@dataclass
class Program:
    """An Ir with its streams and its variables (by name: W0, b0, W1, b1)."""

    ir: popxl.Ir
    x_stream: popxl.HostToDeviceStream
    out_stream: popxl.DeviceToHostStream
    variables: dict[str, popxl.Variable]
    label_stream: popxl.HostToDeviceStream | None = None


def _load_inputs(batch_size: int, with_labels: bool):
    x_stream = popxl.h2d_stream((batch_size, IMAGE), popxl.float32, "x")
    x = ops.host_load(x_stream, "x")
    if not with_labels:
        return x_stream, x, None, None
    label_stream = popxl.h2d_stream((batch_size,), popxl.int32, "labels")
    return x_stream, x, label_stream, ops.host_load(label_stream, "labels")


def _variables(weights: dict[str, np.ndarray]) -> dict[str, popxl.Variable]:
    return {name: popxl.variable(data, popxl.float32, name=name) for name, data in weights.items()}


def _store(t: popxl.Tensor, name: str) -> popxl.DeviceToHostStream:
    stream = popxl.d2h_stream(t.shape, t.dtype, name)
    ops.host_store(stream, t)
    return stream


def build_train_ir(weights: dict[str, np.ndarray], batch_size: int, lr: float) -> Program:
    """One SGD step per `Session.run`: load a batch, forward, loss, backward, update, store loss."""
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        x_stream, x, label_stream, labels = _load_inputs(batch_size, with_labels=True)
        v = _variables(weights)
        lin0, lin1 = Linear(), Linear()
        graph0 = ir.create_graph(lin0, x, out_features=HIDDEN)
        x1_spec = popxl.TensorSpec((batch_size, HIDDEN), popxl.float32)
        graph1 = ir.create_graph(lin1, x1_spec, out_features=CLASSES)
        # autodiff adds forward outputs, so it must run before the graphs are called.
        # The first layer's input is data: only its weights need gradients.
        grad0 = transforms.autodiff(graph0, grads_required=[lin0.W, lin0.b])
        grad1 = transforms.autodiff(graph1)

        fwd0 = ops.call_with_info(graph0, x, inputs_dict={lin0.W: v["W0"], lin0.b: v["b0"]})
        x1 = fwd0.outputs[0]
        fwd1 = ops.call_with_info(graph1, x1, inputs_dict={lin1.W: v["W1"], lin1.b: v["b1"]})
        probs = ops.softmax(fwd1.outputs[0], axis=-1)
        loss, dlogits = ops.nll_loss_with_softmax_grad(probs, labels)

        bwd1 = ops.call_with_info(grad1.graph, dlogits, inputs_dict=grad1.inputs_dict(fwd1))
        grads = grad1.fwd_parent_ins_to_grad_parent_outs(fwd1, bwd1)
        bwd0 = ops.call_with_info(grad0.graph, grads[x1], inputs_dict=grad0.inputs_dict(fwd0))
        grads.update(grad0.fwd_parent_ins_to_grad_parent_outs(fwd0, bwd0))
        for var in v.values():
            ops.scaled_add_(var, grads[var], b=-lr)
        loss_stream = _store(loss, "loss")
    return Program(ir, x_stream, loss_stream, v, label_stream)


def build_test_ir(batch_size: int) -> Program:
    """Forward only: load a batch, store the logits. Weights are written in after training."""
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        x_stream, x, _, _ = _load_inputs(batch_size, with_labels=False)
        v = _variables({k: np.zeros_like(w) for k, w in init_weights().items()})
        lin0, lin1 = Linear(), Linear()
        graph0 = ir.create_graph(lin0, x, out_features=HIDDEN)
        (x1,) = ops.call(graph0, x, inputs_dict={lin0.W: v["W0"], lin0.b: v["b0"]})
        graph1 = ir.create_graph(lin1, x1, out_features=CLASSES)
        (logits,) = ops.call(graph1, x1, inputs_dict={lin1.W: v["W1"], lin1.b: v["b1"]})
        logits_stream = _store(logits, "logits")
    return Program(ir, x_stream, logits_stream, v)


def sim_step(program: Program, session: popxl.Session) -> StepFn:
    """A training step on the simulator (the session must be attached: `with session:`)."""

    def step(x: np.ndarray, labels: np.ndarray) -> float:
        out = session.run({program.x_stream: x, program.label_stream: labels})
        return float(out[program.out_stream])

    return step


def sim_predict(program: Program, session: popxl.Session) -> PredictFn:
    """Logits of a batch from the test Ir (the session must be attached)."""
    return lambda x: session.run({program.x_stream: x})[program.out_stream]


def copy_weights(
    src: Program, src_session: popxl.Session, dst: Program, dst_session: popxl.Session
) -> None:
    """Write the trained variable values of ``src`` into the same-named variables of ``dst``."""
    values = src_session.get_tensors_data(list(src.variables.values()))
    dst_session.write_variables_data(
        {dst.variables[k]: values[var].copy() for k, var in src.variables.items()}
    )


# eager PyTorch -------------------------------------------------------------------------------
def eager_params(weights: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.tensor(w, requires_grad=True) for k, w in weights.items()}


def eager_forward(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    h = F.gelu(x @ p["W0"] + p["b0"], approximate="tanh")
    return F.gelu(h @ p["W1"] + p["b1"], approximate="tanh")


def eager_step(p: dict[str, torch.Tensor], lr: float) -> StepFn:
    """The same SGD step in eager PyTorch, with autograd."""

    def step(x: np.ndarray, labels: np.ndarray) -> float:
        logits = eager_forward(p, torch.from_numpy(x))
        loss = F.cross_entropy(logits, torch.from_numpy(labels).long())
        grads = torch.autograd.grad(loss, list(p.values()))
        with torch.no_grad():
            for param, g in zip(p.values(), grads, strict=True):
                param.add_(g, alpha=-lr)
        return loss.item()

    return step


def eager_predict(p: dict[str, torch.Tensor]) -> PredictFn:
    def predict(x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return eager_forward(p, torch.from_numpy(x)).numpy()

    return predict


# the loops ------------------------------------------------------------------------------------
def batches(loader: Iterable, epochs: int = 1, max_steps: int | None = None) -> Iterator[Batch]:
    """Flattened float32 images and int32 labels, for ``epochs`` passes or ``max_steps`` batches."""
    count = 0
    for _ in range(epochs):
        for images, labels in loader:
            if max_steps is not None and count >= max_steps:
                return
            count += 1
            yield images.reshape(len(images), -1).numpy(), labels.numpy().astype(np.int32)


def train(
    steps: dict[str, StepFn], data: Iterable[Batch], total: int | None = None, progress: bool = True
) -> dict[str, list[float]]:
    """Run every step function on each batch in turn; returns the per-step losses of each."""
    losses: dict[str, list[float]] = {name: [] for name in steps}
    bar = tqdm(data, total=total, disable=not progress, mininterval=0.5)
    for x, labels in bar:
        for name, step in steps.items():
            losses[name].append(step(x, labels))
        bar.set_description(" ".join(f"{n} loss: {v[-1]:.4f}" for n, v in losses.items()))
    return losses


def evaluate(predict: PredictFn, data: Iterable[Batch]) -> float:
    """Accuracy in percent over the given batches."""
    correct = seen = 0
    for x, labels in data:
        correct += int((np.argmax(predict(x), axis=-1) == labels).sum())
        seen += len(labels)
    return 100.0 * correct / seen


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=positive_int, default=80)
    parser.add_argument("--test-batch-size", type=positive_int, default=80)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--epochs", type=positive_int, default=1)
    parser.add_argument(
        "--max-steps", type=positive_int, default=None, help="cap on training steps"
    )
    add_data_args(parser)
    parser.add_argument("--seed", type=int, default=0, help="initial weights and shuffling")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    train_loader, test_loader = get_data_loaders(
        args.batch_size, args.test_batch_size, seed=args.seed, **data_kwargs(args)
    )
    weights = init_weights(args.seed)
    train_prog = build_train_ir(weights, args.batch_size, args.lr)
    train_session = popxl.Session(train_prog.ir, "ipu_hw")
    params = eager_params(weights)
    total = len(train_loader) * args.epochs
    total = min(total, args.max_steps) if args.max_steps is not None else total
    with train_session:
        steps = {"popxl": sim_step(train_prog, train_session), "torch": eager_step(params, args.lr)}
        train(steps, batches(train_loader, args.epochs, args.max_steps), total)

    test_prog = build_test_ir(args.test_batch_size)
    test_session = popxl.Session(test_prog.ir, "ipu_hw")
    copy_weights(train_prog, train_session, test_prog, test_session)
    test_data = list(batches(test_loader))
    with test_session:
        acc = {
            "popxl": evaluate(sim_predict(test_prog, test_session), test_data),
            "torch": evaluate(eager_predict(params), test_data),
        }
    print(
        f"Test accuracy ({args.dataset}): popxl simulator {acc['popxl']:.2f}%, "
        f"eager PyTorch {acc['torch']:.2f}%"
    )
    print(train_session.report.summary())
    return acc


if __name__ == "__main__":
    main()
