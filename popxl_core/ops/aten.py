"""Aten and AtenGrad: one op whose kernel is a torch operator itself, forward and backward.

``aten_op(fn, inputs, args, kwargs)`` calls ``fn`` (an ATen overload such as
``torch.ops.aten.cat.default``) with ``args``/``kwargs`` in which each `Slot` stands for one
input tensor. The shape rule runs ``fn`` on fake tensors, the kernel runs torch's own CPU
kernel, and the gradient is the ``AtenGrad`` op, whose kernel is torch autograd's backward of
the same call: both directions equal eager PyTorch bit for bit, because they are eager's own
kernels. AtenGrad is itself differentiable the same way (autograd's double backward).

This is what the torch frontend uses for ATen ops that have no PopXL op of their own
(``cat``, ``gather``, ``native_layer_norm``, ``convolution``, ...): the cost model sees its
inputs and outputs, the simulator runs eager's numbers.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from types import BuiltinFunctionType, FunctionType
from typing import Any, Sequence

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode

from .. import dtypes
from ..tensor import Tensor, TensorSpec
from ._utils import rand
from .fake_memo import memo, typed
from .registry import Cost, OpDef, Sample, create_op, no_grad, register
from .unary import detach

__all__ = ["DropoutNoise", "Slot", "aten_op", "torch_random"]


@dataclass(frozen=True)
class Slot:
    """Stands for input tensor ``index`` of an Aten op inside its ``args``/``kwargs``."""

    index: int


@dataclass(frozen=True)
class Vjp:
    """The backward of ``fn`` as a callable ``(*inputs, *cotangents) -> grads of wrt``.

    ``wrt``: positions of the inputs to differentiate; ``outs``: positions of the outputs
    whose cotangents follow the inputs; ``n_in``: how many inputs ``fn`` takes.
    """

    fn: Any
    n_in: int
    wrt: tuple
    outs: tuple

    def __call__(self, *xs: torch.Tensor) -> tuple:
        ins, cots = list(xs[: self.n_in]), xs[self.n_in :]
        nested = torch.is_grad_enabled()  # an outer Vjp differentiates this one
        with torch.enable_grad():
            for i in self.wrt:
                if not ins[i].requires_grad:
                    ins[i] = ins[i].detach().requires_grad_()
            res = _as_tuple(self.fn(*ins))
            pairs = [(res[j], c) for j, c in zip(self.outs, cots) if res[j].requires_grad]
            leaves = [ins[i] for i in self.wrt]
            grads = (
                torch.autograd.grad(
                    [o for o, _ in pairs],
                    leaves,
                    [c.to(o.dtype) for o, c in pairs],
                    allow_unused=True,
                    create_graph=nested,
                )
                if pairs
                else [None] * len(leaves)
            )
        return tuple(torch.zeros_like(x) if g is None else g for x, g in zip(leaves, grads))


@dataclass(frozen=True)
class Call:
    """``op(*args, **kwargs)`` with the input tensors put in place of the `Slot`s."""

    op: Any
    args: tuple
    kwargs: tuple  # (name, value) pairs: attrs stay hashable

    def __call__(self, *xs: torch.Tensor) -> Any:
        return self._run(self.op, xs)

    def fake(self, *xs: torch.Tensor) -> Any:
        """What the shape rules run on fake tensors: the operator's own ``fake`` where it
        declares one (an output shape torch's fake kernels cannot tell: ctc_loss with tensor
        lengths sizes an intermediate by their values), else the operator itself."""
        return self._run(getattr(self.op, "fake", self.op), xs)

    def _run(self, op: Any, xs: tuple) -> Any:
        def fill(v: Any) -> Any:
            return xs[v.index] if isinstance(v, Slot) else v

        args, kwargs = pytree.tree_map(fill, (self.args, dict(self.kwargs)))
        return op(*args, **kwargs)

    def __str__(self) -> str:
        return getattr(self.op, "__name__", str(self.op))


def _as_tuple(out: Any) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _fake(specs: Sequence[TensorSpec], torch_dtypes: tuple) -> list[torch.Tensor]:
    return [torch.empty(tuple(s.shape), dtype=d) for s, d in zip(specs, torch_dtypes)]


_FAKE = threading.local()


def _fake_mode() -> FakeTensorMode:
    """This thread's FakeTensorMode for the shape rules, made once: a new one reads the whole
    Python stack (it records where it was made), ~0.3 ms, twice per Aten op built."""
    mode = getattr(_FAKE, "mode", None)
    if mode is None:
        mode = _FAKE.mode = FakeTensorMode(allow_non_fake_inputs=True)
    return mode


def _infer(ins: Sequence[TensorSpec], fn: Any, torch_dtypes: tuple) -> list[TensorSpec]:
    if isinstance(fn, Vjp):  # gradients have the shapes and dtypes of their inputs
        return [ins[i] for i in fn.wrt]
    return list(_by_call("specs", fn, [s.shape for s in ins], torch_dtypes, _fake_specs, ins))


def _by_call(kind: str, fn: Any, shapes: list, torch_dtypes: tuple, compute, specs) -> tuple:
    """``compute(specs, fn, torch_dtypes)`` (a fake-tensor run), memoised where `fake_key`
    keys ``fn`` and no torch function mode could intercept torch's functions. The key is
    complete: the fake inputs are made from the shapes and dtypes alone; torch's default
    dtype types Python scalars and factory outputs; inference mode changes what autograd
    records."""
    key = fake_key(fn)
    if key is None or torch._C._len_torch_function_stack():
        return tuple(compute(specs, fn, torch_dtypes))
    state = (torch.get_default_dtype(), torch.is_inference_mode_enabled())
    full = (kind, key, tuple(shapes), torch_dtypes, state)
    return memo(full, lambda: tuple(compute(specs, fn, torch_dtypes)))


def fake_key(fn: Any) -> Any:
    """What a fake-tensor run of ``fn`` depends on besides its inputs' shapes and dtypes, as a
    hashable key, or None where that is not known: a `Call` (its operator's key and its
    arguments by value); an operator of torch's ``aten`` namespace or a function of torch's
    own modules (fixed by the torch build; a custom op may have its fake kernel registered
    again, a user's function may read state); the eager dropout noise (this module's code);
    an object whose class gives ``fake_parts()``: (the operator it wraps, its own plain
    values), as the frontend's eager-layout wrapper does."""
    if type(fn) is Call:
        return _combined(Call, fn.op, (fn.args, fn.kwargs))
    if type(fn) is DropoutNoise:
        values = typed((fn.p, fn.shape))
        return None if values is None else (DropoutNoise, values)
    if isinstance(fn, torch._ops.OpOverload):
        return fn if fn.namespace == "aten" else None
    if isinstance(fn, (BuiltinFunctionType, FunctionType)) and _of_torch(fn):
        return fn
    parts = getattr(type(fn), "fake_parts", None)
    return None if parts is None else _combined(type(fn), *parts(fn))


def _combined(kind: type, op: Any, values: Any) -> Any:
    op_key, values_key = fake_key(op), typed(values)
    return None if op_key is None or values_key is None else (kind, op_key, values_key)


def _of_torch(fn: Any) -> bool:
    return (getattr(fn, "__module__", None) or "").split(".")[0] == "torch"


def _fake_specs(ins: Sequence[TensorSpec], fn: Any, torch_dtypes: tuple) -> list[TensorSpec]:
    with _fake_mode():
        outs = _as_tuple(getattr(fn, "fake", fn)(*_fake(ins, torch_dtypes)))
    bad = [type(o).__name__ for o in outs if not isinstance(o, torch.Tensor)]
    if bad:
        raise TypeError(f"{fn} returns {', '.join(bad)}, not tensors")
    return [TensorSpec(tuple(o.shape), dtypes.dtype.as_dtype(o.dtype)) for o in outs]


def _kernel(*xs: torch.Tensor, fn: Any, torch_dtypes: tuple) -> Any:
    ins = [x if x.dtype == d else x.to(d) for x, d in zip(xs, torch_dtypes)]
    outs = _as_tuple(fn(*ins))
    # a view (slice, alias, diagonal) must not share memory with the op's input
    outs = tuple(o.clone() if o._is_view() or any(o is x for x in xs) else o for o in outs)
    return outs if len(outs) > 1 else outs[0]


def _differentiable(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex  # rfft/irfft pass through complex


def _grad(ctx) -> list:
    op = ctx.op
    fn, torch_dtypes = op.attrs["fn"], op.attrs["torch_dtypes"]
    n_in = len(op.inputs)
    wrt = tuple(i for i in range(n_in) if _differentiable(torch_dtypes[i]) and ctx.requires_grad(i))
    outs = tuple(j for j, t in enumerate(op.outputs) if _differentiable(t.dtype.as_torch()))
    if not wrt or not outs:
        return [None] * n_in
    ins = [ctx.input(i) for i in range(n_in)]
    cots = [ctx.grad_output_or_zero(j) for j in outs]
    grad_dtypes = torch_dtypes + tuple(op.outputs[j].dtype.as_torch() for j in outs)
    vjp = Vjp(fn, n_in, wrt, outs)
    grads = create_op(ATEN_GRAD, [*ins, *cots], {"fn": vjp, "torch_dtypes": grad_dtypes})
    full: list = [None] * len(op.inputs)
    for i, g in zip(wrt, grads):
        full[i] = g
    return full


def _cost(ins, outs, attrs) -> Cost:
    """A pass over every input and output; one flop per output element (ATen ops of this
    kind are data movement or elementwise; convolutions go through their own cost where the
    frontend has a Conv op)."""
    nbytes = sum(s.nbytes for s in ins) + sum(s.nbytes for s in outs)
    return Cost(sum(s.nelms for s in outs), nbytes)


def aten_op(fn: Any, inputs: Sequence[Tensor], args: tuple = (), kwargs: dict | None = None):
    """Run ATen operator ``fn`` on ``inputs`` with torch's own kernel (forward and gradient).

    Args:
        fn: a torch operator, e.g. ``torch.ops.aten.cat.default``.
        inputs: the input tensors; `Slot(i)` in ``args``/``kwargs`` stands for ``inputs[i]``.
        args, kwargs: the operator's arguments (python values and `Slot`s).

    Returns:
        the list of output tensors.

    Example:
        >>> # cat([a, b], 1): aten_op(torch.ops.aten.cat.default, [a, b], ([Slot(0), Slot(1)], 1))
    """
    call = Call(fn, _frozen(args), tuple(sorted(_frozen(kwargs or {}).items())))
    torch_dtypes = tuple(t.dtype.as_torch() for t in inputs)
    outs = create_op(ATEN, list(inputs), {"fn": call, "torch_dtypes": torch_dtypes})
    # outputs torch never differentiates (native_layer_norm's mean and rstd): no gradient
    # flows back through them, as in eager, whose backward ops have no derivative for them
    held = _differentiable_outputs(call, inputs, torch_dtypes)
    return [o if keep else detach(o) for o, keep in zip(outs, held)]


def _differentiable_outputs(call: Call, inputs: Sequence[Tensor], torch_dtypes: tuple) -> list:
    specs = [t.spec for t in inputs]
    shapes = [s.shape for s in specs]
    return list(_by_call("held", call, shapes, torch_dtypes, _fake_held, specs))


def _fake_held(specs: Sequence[TensorSpec], call: Call, torch_dtypes: tuple) -> list:
    with _fake_mode(), torch.enable_grad():
        xs = _fake(specs, torch_dtypes)
        xs = [x.requires_grad_() if _differentiable(x.dtype) else x for x in xs]
        try:
            outs = _as_tuple(call.fake(*xs))
        except RuntimeError:  # an input torch never differentiates (running statistics)
            return [True] * len(_as_tuple(call.fake(*[x.detach() for x in xs])))
    return [o.requires_grad or not _differentiable(o.dtype) for o in outs]


def _frozen(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _frozen(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return tuple(_frozen(x) for x in v)
    return v


def _samples() -> list[Sample]:
    """cat (two inputs, gradient to both), gather (an integer input: no gradient for it) and
    native_layer_norm (three outputs, two of them statistics), bitwise against eager."""
    aten = torch.ops.aten
    a, b = rand(2, 3, seed=501), rand(2, 4, seed=502)
    idx = torch.tensor([[0, 2, 1], [1, 1, 0]]).numpy()
    x, w, bias = rand(3, 5, seed=503), rand(5, seed=504), rand(5, seed=505)

    def cat(a, b):
        return aten_op(aten.cat.default, [a, b], ([Slot(0), Slot(1)], 1))[0]

    def gather(a, i):
        return aten_op(aten.gather.default, [a, i], (Slot(0), 1, Slot(1)))[0]

    def layer_norm(x, w, b):
        return aten_op(
            aten.native_layer_norm.default, [x, w, b], (Slot(0), [5], Slot(1), Slot(2), 1e-5)
        )[0]

    def ln_ref(x, w, b):
        return torch.nn.functional.layer_norm(x, [5], w, b, 1e-5)

    exact: dict[str, Any] = {"rtol": 0.0, "atol": 0.0}
    return [
        Sample([a, b], cat, lambda a, b: torch.cat([a, b], 1), name="cat", **exact),
        Sample([a, idx], gather, lambda a, i: torch.gather(a, 1, i), name="gather", **exact),
        Sample([x, w, bias], layer_norm, ln_ref, name="layer_norm", **exact),
    ]


def _grad_samples() -> list[Sample]:
    """AtenGrad on its own: the gradient of tanh (as eager's tanh_backward) and, through its
    own gradient, tanh's double backward, against autograd."""
    x, g = rand(3, 4, seed=506), rand(3, 4, seed=507)
    vjp = Vjp(Call(torch.ops.aten.tanh.default, (Slot(0),), ()), 1, (0,), (0,))

    def build(x, g):
        attrs = {"fn": vjp, "torch_dtypes": (torch.float32, torch.float32)}
        return create_op(ATEN_GRAD, [x, g], attrs)[0]

    def reference(x, g):
        y = torch.tanh(x if x.requires_grad else x.requires_grad_())
        return torch.autograd.grad(y, x, g, create_graph=True)[0]

    return [Sample([x, g], build, reference, rtol=0.0, atol=0.0, name="tanh_backward")]


ATEN = register(
    OpDef("Aten", _infer, _kernel, grad=_grad, cost=_cost, samples=_samples, fp16_in_fp32=False)
)
ATEN_GRAD = register(
    OpDef(
        "AtenGrad",
        _infer,
        _kernel,
        grad=_grad,
        cost=_cost,
        samples=_grad_samples,
        fp16_in_fp32=False,
    )
)


# Random draws from torch's default generator ---------------------------------------------


@dataclass(frozen=True)
class DropoutNoise:
    """Eager CPU dropout's noise: ``empty_like(x).bernoulli_(1 - p).div_(1 - p)`` (ATen's
    ``_dropout_impl``; ``shape`` for feature dropout and torchvision's stochastic depth,
    which draw the same way), from torch's default generator; the output is ``x * noise``."""

    p: float
    shape: tuple | None = None  # per channel or per row (feature dropout, stochastic depth)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        noise = torch.empty_like(x) if self.shape is None else x.new_empty(self.shape)
        return noise.bernoulli_(1 - self.p).div_(1 - self.p)

    def __str__(self) -> str:
        return f"dropout_noise(p={self.p}, shape={self.shape})"


def torch_random(fn: Any, inputs: Sequence[Tensor], args: tuple = (), kwargs: dict | None = None):
    """Like `aten_op`, for an operator that draws from torch's default generator (kept in
    program order, never removed; no gradient flows through the draw). Running it again
    draws new numbers: a transform that re-runs forward ops (recomputation) must keep its
    outputs instead."""
    call = (
        fn
        if isinstance(fn, DropoutNoise)
        else Call(fn, _frozen(args), tuple(sorted(_frozen(kwargs or {}).items())))
    )
    torch_dtypes = tuple(t.dtype.as_torch() for t in inputs)
    return create_op(TORCH_RANDOM, list(inputs), {"fn": call, "torch_dtypes": torch_dtypes})


def _random_samples() -> list[Sample]:
    """Dropout noise equals eager's after the same ``torch.manual_seed``: the sample seeds
    when it builds (nothing draws between the build and the run), the reference before it
    draws."""
    x = rand(4, 5, seed=508)

    def build(x):
        torch.manual_seed(7)
        return torch_random(DropoutNoise(0.5), [x])[0]

    def reference(x):
        torch.manual_seed(7)
        return torch.empty_like(x).bernoulli_(0.5).div_(0.5)

    return [Sample([x], build, reference, grad=False, rtol=0.0, atol=0.0, name="dropout_noise")]


TORCH_RANDOM = register(
    OpDef(
        "TorchRandom",
        _infer,
        _kernel,
        grad=no_grad,  # draws: inputs give only shapes or probabilities
        cost=_cost,
        samples=_random_samples,
        fp16_in_fp32=False,
        side_effect=True,
        stops_gradient=True,
    )
)
