"""The core ATen opset (ops tagged ``torch.Tag.core``, what torch.export backends target):
every packet lowers or is refused by design, and each lowered packet matches eager on
torch's own OpInfo samples, forward and gradient (random cotangent), bit for bit.

Each sample runs through a function the lowering table lacks (``opinfo_call``, marked
torch.fx.wrap), so popxl_fx decomposes it into core ATen ops exactly as it does for any
unknown call, and the test checks the packet under test is in that decomposition.
At most `SAMPLES` samples per op; the fast suite runs the first sample of the packets in
`FAST`, the slow tier all of them.
"""

from __future__ import annotations

import pytest
import torch
import torch.utils._pytree as pytree
from torch import nn
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx

import popxl_fx.lowerings  # noqa: F401 - registers the table
from popxl_fx.lowering import lookup
from popxl_fx.lowerings.aten_kernels import REFUSED

from .core_aten_cases import CUSTOM, GRAD_OF, OPINFO, TOLERANCE
from .fx_harness import check_lowering

SAMPLES = 2
# The fast suite runs the first sample of these (the basics, and the lowerings that once
# differed from eager); every sample of every packet runs in the slow tier (~5 min).
FAST = {
    "addmm",
    "alias",
    "amax",
    "any",
    "arange",
    "argmax",
    "bitwise_and",
    "bitwise_not",
    "cat",
    "clamp",
    "constant_pad_nd",
    "convolution",
    "copy",
    "cos",
    "cumsum",
    "div",
    "floor",
    "full",
    "gather",
    "index",
    "index_select",
    "log1p",
    "max_pool2d_with_indices",
    "mean",
    "native_layer_norm",
    "native_layer_norm_backward",
    "rsqrt",
    "scatter",
    "scatter_add",
    "sin",
    "slice",
    "sum",
    "tanh",
    "upsample_bilinear2d",
    "_fft_c2r",
}
BITWISE = (0.0, 0.0)
# random packets: tests/test_fx_random_torch.py compares them with eager under one seed
RANDOM = {"native_dropout", "rand", "randn", "randperm"}


def core_packets() -> list:
    """Every ATen overload packet with an overload tagged ``torch.Tag.core``."""
    # every registered ATen op (dir(torch.ops.aten) lists only the packets loaded so far)
    all_ops = torch._C._dispatch_get_all_op_names()
    names = {n[len("aten::") :].split(".")[0] for n in all_ops if n.startswith("aten::")}
    found = []
    for name in sorted(names):
        packet = getattr(torch.ops.aten, name, None)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        if any(torch.Tag.core in getattr(packet, o).tags for o in packet.overloads()):
            found.append(packet)
    return found


def coverage() -> dict[str, list[str]]:
    """Core packets sorted into covered (a lowering), refused (by design) and missing."""
    report: dict[str, list[str]] = {"covered": [], "refused": [], "missing": []}
    for packet in core_packets():
        kind = "covered" if lookup(packet) else "refused" if packet in REFUSED else "missing"
        report[kind].append(packet.__name__)
    return report


def test_every_core_aten_packet_lowers_or_is_refused():
    report = coverage()
    total = sum(map(len, report.values()))
    print(
        f"core ATen packets (torch {torch.__version__}): {total}; "
        f"covered {len(report['covered'])}, refused by design {len(report['refused'])}, "
        f"missing {len(report['missing'])}"
    )
    assert not report["missing"], (
        f"core ATen packets without a lowering: {', '.join(report['missing'])}; lower them "
        "(popxl_fx/lowerings/aten_kernels.py) or refuse them there with a reason (REFUSED)."
    )


# --- OpInfo samples through the fallback ----------------------------------------------------

_CALLS: dict[str, object] = {}


def opinfo_call(key, *tensors):
    return _CALLS[key](*tensors)


torch.fx.wrap("opinfo_call")


def _module(key: str, n: int, direct: bool = False) -> nn.Module:
    """An nn.Module whose forward takes ``n`` tensors and calls ``_CALLS[key]`` on them:
    through ``opinfo_call`` (the fallback decomposes it) or ``direct``ly (traced into)."""
    names = ", ".join(f"x{i}" for i in range(n))
    call = f"_CALLS[{key!r}]" if direct else f"opinfo_call({key!r}, "
    src = f"def forward(self, {names}):\n    return {call}{'(' if direct else ''}{names})\n"
    scope: dict = {}
    exec(compile(src, f"<opinfo {key}>", "exec"), globals(), scope)
    return type(f"OpInfo_{key}", (nn.Module,), {"forward": scope["forward"]})()


def _opinfo(name: str):
    from torch.testing._internal.common_methods_invocations import op_db

    base, _, variant = name.partition(":")
    for op in op_db:
        if op.name == base and op.variant_test_name == variant:
            return op
    raise LookupError(f"no OpInfo {name!r}")


def _sample_call(op, sample, backward: bool):
    """(fn of tensors, tensors) for one OpInfo sample; ``backward``: fn returns the gradients
    of the op's float outputs (cotangent ones) with respect to its float tensors."""
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    positions = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
    tensors = [leaves[i].detach().clone() for i in positions]

    def call(*xs):
        filled = list(leaves)
        for i, x in zip(positions, xs):
            filled[i] = x
        inp, args, kwargs = pytree.tree_unflatten(filled, spec)
        return op.op(inp, *args, **kwargs)

    if not backward:
        return call, tensors

    def grad_call(*xs):
        with torch.enable_grad():  # capture runs the model on its example inputs in no_grad
            xs = [x.detach().requires_grad_() if x.is_floating_point() else x for x in xs]
            outs = [o for o in pytree.tree_leaves(call(*xs)) if o.is_floating_point()]
            wrt = [x for x in xs if x.requires_grad]
            return torch.autograd.grad(outs, wrt, [torch.ones_like(o) for o in outs])

    return grad_call, tensors


def _cpu_float32_samples(op):
    """``op.sample_inputs("cpu", torch.float32)`` without its wrapper's search for a unittest
    test function (two ``inspect.stack()`` per call, ~40 ms each here; under pytest it finds
    none): the same samples, the generator seeded with ``SEED`` before each, as the wrapper
    does when it finds none."""
    # torch's test utilities (~0.3 s of CPU to import): imported where used, not in every
    # xdist worker's collection (test_fx_table_opinfo imports this module too)
    from torch.testing._internal.common_utils import SEED, set_rng_seed

    samples = iter(op.sample_inputs_func(op, "cpu", torch.float32, False))
    while True:
        set_rng_seed(SEED)
        try:
            yield next(samples)
        except StopIteration:
            return


# core_aten_decompositions() by the number of ops registered with torch: torch builds the table
# anew on every call (~70 ms), and an op registered later may add to it
_CORE_TABLES: dict[int, dict] = {}


def _core_aten_table() -> dict:
    key = len(torch._C._dispatch_get_all_op_names())
    if key not in _CORE_TABLES:
        _CORE_TABLES[key] = core_aten_decompositions()
    return dict(_CORE_TABLES[key])  # a copy: make_fx may keep or change what it is given


def _aten_packets(fn, tensors) -> set[str]:
    with torch.random.fork_rng(devices=[]):
        gm = make_fx(fn, decomposition_table=_core_aten_table())(*tensors)
    return {
        n.target.overloadpacket.__name__
        for n in gm.graph.nodes
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
    }


def _eager_differentiates(fn, tensors) -> bool:
    """Whether eager autograd has a derivative for this call (scatter with reduce= has none)."""
    xs = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in tensors]
    outs = [o for o in pytree.tree_leaves(fn(*xs)) if getattr(o, "requires_grad", False)]
    if not outs:
        return False
    try:
        torch.autograd.grad(
            outs,
            [x for x in xs if x.requires_grad],
            allow_unused=True,
            grad_outputs=[torch.ones_like(o) for o in outs],
        )
    except (RuntimeError, NotImplementedError) as exc:
        if "not implemented" in str(exc):
            return False
        raise
    return True


def _param(name: str, source: str | None, k: int) -> object:
    marks = () if k == 0 and name in FAST else (pytest.mark.slow,)
    return pytest.param(name, source, k, id=f"{name}-{source or 'custom'}-{k}", marks=marks)


def _cases() -> list:
    cases = []
    for name in coverage()["covered"]:
        if name in RANDOM:
            continue
        if name in CUSTOM:
            cases.append(_param(name, None, 0))
            continue
        source = GRAD_OF.get(name) or OPINFO.get(name, name)
        cases.extend(_param(name, source, k) for k in range(SAMPLES))
    return cases


def _float32_samples(op, packet: str, backward: bool, count: int) -> list:
    """The op's first ``count`` float32 CPU samples whose decomposition reaches ``packet``
    (sample k needs only k + 1 of them traced: each trace is a make_fx run)."""
    out = []
    for sample in _cpu_float32_samples(op):
        fn, tensors = _sample_call(op, sample, backward)
        try:
            reached = packet in _aten_packets(fn, tensors)
        except Exception:  # a sample torch itself cannot trace is skipped
            continue
        if reached:
            out.append((fn, tensors))
        if len(out) == count:
            break
    return out


@pytest.mark.parametrize("packet,source,k", _cases())
def test_core_aten_packet_matches_eager(packet, source, k):
    direct = False
    if source is None:
        fn, tensors, direct = CUSTOM[packet]
        tensors = [t.clone() for t in tensors]
        if not direct:
            assert packet in _aten_packets(fn, tensors), f"the case does not reach aten.{packet}"
        grad = True
    else:
        op = _opinfo(source)
        backward = packet in GRAD_OF
        samples = _float32_samples(op, packet, backward, k + 1)
        if k >= len(samples):
            if k == 0:
                pytest.fail(f"no float32 sample of OpInfo {source!r} reaches aten.{packet}")
            pytest.skip(f"OpInfo {source!r} has {len(samples)} sample(s) reaching aten.{packet}")
        fn, tensors = samples[k]
        grad = op.supports_autograd and not backward
    grad = grad and _eager_differentiates(fn, tensors)
    key = f"{packet}-{source}-{k}"
    _CALLS[key] = fn
    rtol, atol = TOLERANCE.get(packet, BITWISE)
    check_lowering(_module(key, len(tensors), direct), *tensors, rtol=rtol, atol=atol, grad=grad)


class _NonZero(nn.Module):
    def forward(self, x):
        return torch.ops.aten.nonzero.default(x).float().sum()  # nonzero-line


class _Item(nn.Module):
    def forward(self, x):
        return x * torch.ops.aten._local_scalar_dense.default(x.sum())  # item-line


class _Resize(nn.Module):
    def forward(self, x):
        return torch.ops.aten.resize_.default(x.clone(), [8]).sum()  # resize-line


@pytest.mark.parametrize(
    "model,marker,packet,words",
    [
        (_NonZero, "nonzero-line", "nonzero", "depends on tensor data"),
        (_Item, "item-line", "_local_scalar_dense", "cannot branch on"),
        (_Resize, "resize-line", "resize_", "resizes a tensor's storage"),
    ],
    ids=["nonzero", "_local_scalar_dense", "resize_"],
)
def test_refused_packets_are_reported_by_check_at_the_users_line(model, marker, packet, words):
    from popxl_fx.check import check

    report = check(model(), torch.randn(2, 4))
    issue = next(i for i in report.issues if packet in i.what)
    line = next(i for i, t in enumerate(open(__file__), 1) if t.rstrip().endswith(f"# {marker}"))
    assert issue.source == f"{__file__}:{line}"
    assert words in issue.hint
    assert issue.hint.startswith(REFUSED[getattr(torch.ops.aten, packet)][:30])
