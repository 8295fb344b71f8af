"""Replicas in lock step computing a shared-weight op as one stacked kernel
(popxl_core/sim/stacking.py) against the same program with it switched off
(``CompileOptions(stack_replicas=False)``: each replica runs its own kernel): losses,
weights and optimizer state equal bit for bit (tolerance 0) for the seed MLP, GPT and a
batch-norm CNN, with and without RTS and gradient accumulation, and runs where the replicas
do not share the weights (stacking then falls back to each replica's own kernel).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import popxl_fx
from popxl_core.sim import CompileOptions, stacking
from popxl_core.sim.batched_site import BatchedSite, RowsAt, StackRequest
from popxl_core.sim.stacking import stacked_values
from popxl_core.sim.variants import SiteFacts
from tests.fx_zoo import GPT, SeedMLP, small_cnn

# replica folding (fold.py, tests/test_replica_folding.py) off: the replicas run in lock
# step, where the hub stacks
STACKED = CompileOptions(fold_replicas=False)
OWN = CompileOptions(stack_replicas=False, fold_replicas=False)
UNSHARED = CompileOptions(share_uniform=False)  # weights per replica: nothing to stack


def _data(model: str, batch: int, g: torch.Generator):
    if model == "gpt":
        idx = torch.randint(0, 64, (batch, 16), generator=g)
        return (idx, torch.randint(0, 64, (batch, 16), generator=g))
    return (torch.randn(batch, 1, 28, 28, generator=g), torch.randint(0, 10, (batch,), generator=g))


def _model(model: str) -> nn.Module:
    return {"mlp": SeedMLP, "gpt": GPT, "cnn": small_cnn}[model]()


@pytest.fixture(autouse=True)
def _every_size(monkeypatch):
    """Stack whatever the weight size (GPT's and the CNN's layers are below the bytes where
    it pays), so these small models exercise every site."""
    monkeypatch.setattr(stacking, "MIN_SHARED_BYTES", 0)


def _train(model: str, replicas: int, compiler: CompileOptions, rts=False, accum=1, steps=3):
    torch.manual_seed(0)
    net = _model(model)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    options = popxl_fx.Options(
        device="cpu",
        replication_factor=replicas,
        replicated_tensor_sharding=rts,
        gradient_accumulation=accum,
        compiler=compiler,
    )
    loss_fn = None if model == "gpt" else F.cross_entropy
    trainer = popxl_fx.training_model(net, opt, loss_fn, options)
    g = torch.Generator().manual_seed(1)
    losses = [trainer(*_data(model, 4 * replicas * accum, g)) for _ in range(steps)]
    return _outcome(losses, net, opt, trainer._programs.active.session)


def _outcome(losses, net, opt, last) -> tuple:
    """What `_assert_same` compares: the losses, the model's state and the optimizer's
    (keyed by parameter index and name); ``last`` (the session or program, for the test to
    look into) rides along."""
    state = {(i, k): v for i, s in opt.state_dict()["state"].items() for k, v in s.items()}
    return torch.stack(losses), net.state_dict(), state, last


def _assert_same(a, b) -> None:
    assert a[0].shape == b[0].shape and torch.equal(a[0], b[0])
    for x, y in ((a[1], b[1]), (a[2], b[2])):
        assert x.keys() == y.keys()
        for k in x:
            assert torch.equal(x[k], y[k]), k


def _sites(session) -> list:
    ns = session._program.namespace
    return [v for v in ns.values() if isinstance(v, BatchedSite)]


@pytest.mark.parametrize(
    "model, replicas, rts, accum, shares",
    [
        ("mlp", 4, False, 1, True),
        ("mlp", 2, True, 1, False),
        # uniform.py does not share the weights a gradient-accumulation loop reads
        ("mlp", 2, False, 2, False),
        ("gpt", 2, False, 1, True),
        ("cnn", 2, False, 1, True),
        ("cnn", 2, True, 2, False),
    ],
)
def test_stacked_is_bitwise_each_replicas_own(model, replicas, rts, accum, shares):
    """``shares``: every replica's weights are one tensor (uniform.py), so every site stacks
    (its bit check held); else some or all sites fall back to each replica's own kernel."""
    stacked = _train(model, replicas, STACKED, rts, accum)
    own = _train(model, replicas, OWN, rts, accum)
    _assert_same(stacked, own)
    assert own[3]._program.stats["stacked_ops"] == 0
    sites = _sites(stacked[3])
    assert sites and stacked[3]._program.stats["stacked_ops"] == len(sites)
    if shares:  # each site met its shapes (and was checked there)
        assert all(s.checked.found for s in sites)
    if shares and model == "mlp" and _rows_invariant(replicas):
        # on a CPU whose GEMMs give a row the same bits whatever rows come with it (the
        # AMD EPYC here; not the Intel Xeon's MKL), every site's stacked form holds
        assert all(all(s.checked.found.values()) for s in sites)


def _rows_invariant(replicas: int, rows: int = 4) -> bool:
    """This CPU's forward and input-gradient GEMMs of the seed MLP's layers give each
    replica's rows the same bits computed over all replicas' rows as over its own."""
    g = torch.Generator().manual_seed(0)
    for k, n in ((784, 512), (512, 512), (512, 10)):
        x, w = torch.randn(replicas * rows, k, generator=g), torch.randn(n, k, generator=g)
        b, dy = torch.randn(n, generator=g), torch.randn(replicas * rows, n, generator=g)
        parts = [slice(r * rows, (r + 1) * rows) for r in range(replicas)]
        fwd = torch.cat([torch.addmm(b, x[p], w.t()) for p in parts])
        dx = torch.cat([dy[p] @ w for p in parts])
        if not (torch.equal(torch.addmm(b, x, w.t()), fwd) and torch.equal(dy @ w, dx)):
            return False
    return True


def test_unshared_weights_fall_back_to_each_replicas_own():
    """Without uniform sharing every replica has its own weight tensor: never stacked."""
    stacked = _train("mlp", 2, UNSHARED)
    own = _train("mlp", 2, CompileOptions(share_uniform=False, stack_replicas=False))
    _assert_same(stacked, own)
    sites = _sites(stacked[3])
    assert sites and all(not s.checked.found for s in sites)


def test_one_replica_has_no_sites():
    assert _train("mlp", 1, STACKED)[3]._program.stats["stacked_ops"] == 0


def test_switch_is_a_compile_option():
    assert CompileOptions().stack_replicas and not OWN.stack_replicas


def test_seed_mlp_weights_are_stacked_at_the_default_size(monkeypatch):
    """The default size threshold keeps the seed MLP's 1-1.6 MB weights stacked."""
    monkeypatch.setattr(stacking, "MIN_SHARED_BYTES", 256 * 1024)
    session = _train("mlp", 2, STACKED, steps=1)[3]
    names = sorted(s.op.opdef.name for s in _sites(session))
    assert names == ["Linear"] * 3 + ["LinearGrad"] * 3  # not the (10, 512) last layer


# the hub's decision, on hand-made requests -------------------------------------------
def _site(form, replicas=2):
    """A site of ``x @ w`` (x: 2 x 5 a replica, w shared) whose one form over the rows is
    ``form``."""
    shapes = [(2, 5), (5, 3)]
    op = SimpleNamespace(attrs={}, inputs=[SimpleNamespace(shape=s) for s in shapes])
    op.outputs = [SimpleNamespace(shape=(2, 3))]
    facts = SiteFacts(plain=True, dead=frozenset(), keeps=False)
    own, per = (lambda x, w: x @ w), (True, False)
    return BatchedSite(op, RowsAt.CALL, facts, own, per, [form], replicas)


def _own(r, q):
    return (q.site.own(*q.args),)


def _rows(x, w):
    return x @ w


def test_hub_stacks_only_the_same_op_with_one_weight():
    w = torch.randn(5, 3)
    site, other = _site(_rows, 3), _site(_rows, 3)
    xs = [torch.randn(2, 5) for _ in range(3)]
    got = stacked_values([StackRequest(site, (x, w)) for x in xs], _own)
    assert got is not None and all(torch.equal(g[0], x @ w) for g, x in zip(got, xs))
    assert list(site.checked.found.values()) == list(site.checked.forms)
    # another op, a replica at a collective (None), or weights in different memory: no
    mixed = [StackRequest(site, (xs[0], w)), StackRequest(other, (xs[1], w))]
    assert stacked_values(mixed, _own) is None
    assert stacked_values([StackRequest(site, (xs[0], w)), None], _own) is None
    copies = [StackRequest(site, (x, w.clone())) for x in xs]
    assert stacked_values(copies, _own) is None
    # inputs of different shapes do not stack
    ragged = [StackRequest(site, (torch.randn(n, 5), w)) for n in (1, 2)]
    assert stacked_values(ragged, _own) is None


def test_hub_falls_back_where_the_stacked_bits_differ():
    """A stacked form whose bits differ from each replica's own kernel is used never again
    for those shapes: the replicas compute their own."""

    def off_by_one_ulp(x, w):
        return torch.nextafter(x @ w, torch.tensor(float("inf")))

    site, w = _site(off_by_one_ulp), torch.randn(5, 3)
    requests = [StackRequest(site, (torch.randn(2, 5), w)) for _ in range(2)]
    assert stacked_values(requests, _own) is None
    assert list(site.checked.found.values()) == [None]
    assert stacked_values(requests, _own) is None  # not tried again


def test_hub_falls_back_where_the_stacked_form_raises():
    """A stacked form that raises on the replicas' arguments (shapes its rule did not
    foresee) is passed over as one with other bits is (`bits.Checked`): each replica's own."""

    def unforeseen(x, w):
        raise RuntimeError("shapes the rule did not foresee")

    site, w = _site(unforeseen), torch.randn(5, 3)
    requests = [StackRequest(site, (torch.randn(2, 5), w)) for _ in range(2)]
    assert stacked_values(requests, _own) is None
    assert list(site.checked.found.values()) == [None]


# the lock-step hub with replicas at different waits -----------------------------------
def _sum_fn(replica, value, values):
    return sum(values[1:], values[0])


def test_lockstep_replicas_at_different_waits_each_compute_their_own():
    """Replica 0 meets the stack site before a collective, replica 1 after it: the hub
    answers replica 0's wait with None (it runs its own kernel), the collective then meets,
    and replica 1 runs the site alone after it. Every result is its own kernel's."""
    from popxl_core.sim.lockstep import run_lockstep
    from popxl_core.sim.runtime import Runtime

    runtime = Runtime(replicas=2)
    site = _site(_rows)
    site.runtime = runtime
    w = torch.randn(5, 3)
    xs = [torch.randn(2, 5) for _ in range(2)]
    got = {}

    def body(r):
        if r == 0:
            got["y0"] = site(xs[0], w)
            got["c0"] = runtime.collective(torch.tensor([1.0]), _sum_fn)
        else:
            got["c1"] = runtime.collective(torch.tensor([2.0]), _sum_fn)
            got["y1"] = site(xs[1], w)

    run_lockstep(runtime, body)
    assert torch.equal(got["y0"], xs[0] @ w) and torch.equal(got["y1"], xs[1] @ w)
    assert got["c0"].item() == got["c1"].item() == 3.0
    assert not site.checked.found  # never stacked


def test_threaded_replicas_run_their_own_kernels(monkeypatch):
    """One OS thread per replica (``runtime.LOCKSTEP = False``): no hub, no stacking; the
    same bits."""
    from popxl_core.sim import runtime

    monkeypatch.setattr(runtime, "LOCKSTEP", False)
    threaded = _train("mlp", 2, STACKED, steps=2)
    _assert_same(threaded, _train("mlp", 2, OWN, steps=2))
    assert all(not s.checked.found for s in _sites(threaded[3]))
