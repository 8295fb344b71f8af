"""Replica batching's interfaces (popxl_core/sim/batching.py): the runtime protocol both
runtimes provide, and no replica module reaching into a runtime's private state."""

import pathlib
import re

import numpy as np
import pytest
import torch

import popxl_core as popxl
from popxl_core import ops
from popxl_core.ops import collectives as coll
from popxl_core.ops.elementwise import ADD
from popxl_core.ops.forms import ReplicaFold
from popxl_core.ops.linear import LINEAR
from popxl_core.ops.registry import OpDef, no_cost
from popxl_core.sim import CompileOptions, runtime, speed
from popxl_core.sim.batching import ReplicaRuns, ReplicaRuntime
from popxl_core.sim.bits import Checked, first_match, same_outputs
from popxl_core.sim.fold import FoldPlan, FoldRuntime
from popxl_core.sim.runtime import ReplicaSchedule, Runtime
from popxl_core.sim.speed import fold_rule, stack_rule
from tests.test_replica_stacking import _assert_same, _train

FOLD_OFF = CompileOptions(fold_replicas=False)
SIM = pathlib.Path(__file__).resolve().parents[1] / "popxl_core" / "sim"


def test_both_runtimes_provide_the_replica_runtime_protocol():
    assert isinstance(Runtime(2), ReplicaRuntime)
    assert isinstance(FoldRuntime(FoldPlan(2, frozenset())), ReplicaRuntime)


def test_the_protocol_is_checked():
    """A runtime lacking a member the compiled code calls is not a `ReplicaRuntime`."""

    class NoCollective:
        replicas, local, replica, slot, counts = 1, range(1), 0, 0, {}

        def start(self, inputs, outputs): ...

        def load(self, stream): ...

        def skip(self, stream): ...

        def store(self, stream, value): ...

    assert not isinstance(NoCollective(), ReplicaRuntime)


def test_no_sim_module_reaches_into_a_runtime():
    """The replica machinery uses the runtime's public methods (`Runtime.meeting`,
    `run_as`, `stack_hub`, `spans_processes`), not its private attributes."""
    reach = re.compile(r"\bruntime\._[a-z]")
    offenders = [
        p.name for p in SIM.glob("*.py") if p.name != "runtime.py" and reach.search(p.read_text())
    ]
    assert offenders == []


def test_an_op_has_one_batching_rule_holding_its_fold_and_stack_forms():
    """`speed.declare`'s ``replica_fold=`` and ``replica_stack=`` fill one `ReplicaBatching`
    row of one table; giving the whole rule and a field of it is refused."""
    rule = speed.REPLICA_BATCHING[LINEAR]
    assert rule.fold is fold_rule(LINEAR) and rule.stack is stack_rule(LINEAR)
    assert stack_rule(ADD) is None and fold_rule(ADD) is not None
    assert not {"replica_fold", "replica_stack", "replica_reduce"} & {t.name for t in speed.TABLES}
    row = OpDef("NotRegistered", lambda ins: ins, torch.neg, cost=no_cost)
    fold = ReplicaFold(rows=lambda attrs, shapes, per: True)
    try:
        speed.declare(row, replica_fold=fold)
        assert speed.REPLICA_BATCHING[row] == speed.ReplicaBatching(fold=fold)
        with pytest.raises(TypeError, match="not both"):
            speed.declare(row, replica_batching=speed.ReplicaBatching(), replica_stack=fold)
    finally:
        speed.REPLICA_BATCHING.rows.pop(row, None)


def test_a_folded_all_reduce_is_its_rule_in_the_one_table(monkeypatch):
    """How an all-reduce runs in a folded program is its `ReplicaReduce` row: which
    reductions one sum over the replica dim may make. Without the row no program holding
    one folds (each replica runs its own step, the same bits); with ``summed`` empty the
    program folds but every all-reduce is its own reduction, alone (no `ReduceBy`)."""
    from popxl_core.ops.collectives.replicated import ALL_REDUCE, ALL_REDUCE_INPLACE
    from popxl_core.ops.forms import ReplicaReduce
    from popxl_core.sim.speed import reduce_rule

    assert reduce_rule(ALL_REDUCE).summed == ("add", "mean") and not reduce_rule(ADD)
    assert reduce_rule(ALL_REDUCE_INPLACE) is None
    want = _train("mlp", 2, CompileOptions(), steps=2)
    rows = speed.REPLICA_BATCHING.rows
    for rule in (None, ReplicaReduce()):
        monkeypatch.setitem(rows, ALL_REDUCE, speed.ReplicaBatching(reduce=rule))
        got = _train("mlp", 2, CompileOptions(), steps=2)
        _assert_same(got, want)
        fold = got[3]._replicas.fold
        assert (fold is None) == (rule is None)
        if fold is not None:
            assert not fold.fold.reduce_by and "RT.collective" in fold.main.source


def _session(collective: bool, replicas: int = 2):
    """A replicated Ir storing x (plus an all-reduce of it where ``collective``)."""
    ir = popxl.Ir(replicas)
    with ir.main_graph, popxl.in_sequence():
        x = popxl.variable(np.arange(3, dtype=np.float32), name="x")
        y = coll.replicated_all_reduce(x, "add") if collective else x + 1
        s = popxl.d2h_stream(y.shape, y.dtype, "y")
        ops.host_store(s, y)
    return popxl.Session(ir, "ipu_hw")


@pytest.mark.parametrize(
    "collective, lockstep, want",
    [
        (False, True, ReplicaSchedule.ONE_BY_ONE),
        (True, True, ReplicaSchedule.LOCK_STEP),
        (True, False, ReplicaSchedule.THREADS),
    ],
)
def test_each_run_picks_one_schedule(monkeypatch, collective, lockstep, want):
    """`ReplicaRuns.prepare` decides how a run executes its replicas, in one place: one by
    one without collectives, lock step with them, threads where lock step is off; the
    stored values are the same whichever runs."""
    monkeypatch.setattr(runtime, "LOCKSTEP", lockstep)
    seen = []
    prepare = ReplicaRuns.prepare
    monkeypatch.setattr(ReplicaRuns, "prepare", lambda *a: seen.append(prepare(*a)) or seen[-1])
    with _session(collective) as sess:
        (out,) = sess.run().values()
    assert seen == [want]
    want_rows = [0.0, 2.0, 4.0] if collective else [1.0, 2.0, 3.0]
    np.testing.assert_array_equal(out, np.array([want_rows] * 2, dtype=np.float32))


def test_one_bit_check_picks_the_first_form_with_the_fallbacks_bits():
    """`bits.first_match`: forms tried in order; one that raises or differs in one bit (or
    in the sign of a zero) is passed over; none matching leaves the fallback."""
    x = torch.tensor([1.0, -0.0, 3.0])
    want = (x * 2, None)

    def raises(t):
        raise RuntimeError("a shape the rule did not foresee")

    def one_ulp_off(t):
        return torch.nextafter(t * 2, torch.tensor(9.0)), None

    def zero_of_the_other_sign(t):
        return t.abs() * 2, None

    def exact(t):
        return t + t, None

    def makes_the_dead_output(t):
        return t * 2, t

    forms = [raises, one_ulp_off, zero_of_the_other_sign, makes_the_dead_output, exact]
    found = first_match(forms, (x,), want)
    assert found is not None and found[0] is exact and same_outputs(found[1], want)
    assert first_match(forms[:-1], (x,), want) is None
    assert not same_outputs((x,), want) and same_outputs((None,), (None,))


def test_the_folded_program_switches_nothing_off_for_sharing_or_stacking():
    """The folded program compiles with the user's share_uniform and stack_replicas: its
    runtime runs one run for all replicas, so neither applies (no follower program, no
    stacked site), and the step is the unfolded one's, bit for bit."""
    folded, off = _train("mlp", 2, CompileOptions(), steps=2), _train("mlp", 2, FOLD_OFF, steps=2)
    _assert_same(folded, off)
    program = folded[3]._replicas.fold
    assert program is not None and program.namespace["RT"].runs == 2
    assert program.options.share_uniform and program.options.stack_replicas
    assert program.sharing is None and program.stats["stacked_ops"] == 0


def test_the_compiler_asks_one_batching_entry_per_site():
    """compile.py hands every op it emits to `batching.emit_batched`, which decides whether
    it is a folded site, a stacked site or neither: the compiler imports neither mechanism."""
    source = (SIM / "compile.py").read_text()
    assert "emit_batched(op, plan, em" in source
    assert not re.search(r"from \.(fold|fold_site|stacking) import", source)


def test_stacked_and_folded_sites_read_one_site_analysis():
    """`variants.site_facts` is the one analysis of an op's use that kernel variants and
    both batched forms read: the seed MLP's first layer's gradient op (its input gradient
    unread: dead) has the same facts as a stack site (folding off) and as a fold site."""
    from popxl_core.ops.linear import LINEAR_GRAD
    from popxl_core.sim.batched_site import BatchedSite, RowsAt
    from popxl_core.sim.variants import SiteFacts

    stacked = _train("mlp", 2, FOLD_OFF, steps=1)[3]
    folded = _train("mlp", 2, CompileOptions(), steps=1)[3]
    namespace = stacked._program.namespace.values()
    stack_sites = [s for s in namespace if isinstance(s, BatchedSite) and s.op.opdef is LINEAR_GRAD]
    fold_sites = [s for s in folded._replicas.fold.fold.sites if s.op.opdef is LINEAR_GRAD]
    first = SiteFacts(plain=True, dead=frozenset({0}), keeps=True)
    (stack,) = [s for s in stack_sites if s.facts == first]
    assert stack.skip == frozenset({0})  # the stacked call does not make the unread dx
    assert [s.facts for s in fold_sites].count(first) == 1
    # one site class: only when the rows are made differs
    assert stack.rows_at is RowsAt.CALL and {s.rows_at for s in fold_sites} == {RowsAt.STEP}


def test_a_sites_check_is_remembered_per_key():
    """`bits.Checked`: a key's first check tries the forms in order and remembers the one
    with the fallback's bits, or None (the fallback); each key is checked on its own, and
    `clear` forgets them all (a thread count change)."""
    x = torch.tensor([1.0, 2.0])

    def double(t):
        return t * 2

    checked = Checked([double])
    found = checked.check("rows 2", (x,), (x + x,))
    assert found is not None and found[0] is double and checked.form("rows 2") is double
    assert checked.check("other bits", (x,), (x + x + 1,)) is None
    assert "other bits" in checked and checked.form("other bits") is None
    checked.clear()
    assert "rows 2" not in checked and checked.form("rows 2") is None


def test_a_program_checking_specs_neither_folds_nor_stacks():
    """The per-program half of the decision (`batching._folds`, `_stacks`): a program that
    checks every kernel's output specs runs each replica's own kernels (a batched call is
    not the op's own), with the same bits as the batched program."""
    checking = _train("mlp", 2, CompileOptions(check_specs=True), steps=2)
    batched = _train("mlp", 2, CompileOptions(), steps=2)
    _assert_same(checking, batched)
    session = checking[3]
    assert session._replicas.fold is None and session._program.stats["stacked_ops"] == 0
    assert batched[3]._replicas.fold is not None and batched[3]._program.stats["stacked_ops"] > 0


def test_the_hub_stacks_with_the_ops_fold_forms():
    """An op's stack rule says only which inputs must be one memory on every replica
    (`forms.ReplicaStack.shared`); the stacked call is the op's ``fold`` forms over the
    replicas' other inputs concatenated: the linear layer's two (one GEMM over all rows, one
    a replica), the linear gradient's four folded kernels, tried in order."""
    import dataclasses

    from popxl_core.ops.forms import ReplicaStack
    from popxl_core.ops.linear import LINEAR_GRAD
    from popxl_core.sim.batched_site import BatchedSite

    assert [f.name for f in dataclasses.fields(ReplicaStack)] == ["shared"]
    session = _train("mlp", 2, FOLD_OFF, steps=1)[3]
    sites = [s for s in session._program.namespace.values() if isinstance(s, BatchedSite)]
    forms = {(s.op.opdef, len(s.checked.forms)) for s in sites}
    rules = [(op, len(fold_rule(op).kernels)) for op in (LINEAR, LINEAR_GRAD)]
    assert forms == set(rules) and rules[0][1] == 2
    assert all(s.checked.found for s in sites)  # met at the hub and checked there
