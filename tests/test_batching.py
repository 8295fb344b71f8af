"""Replica batching's interfaces (popxl_core/sim/batching.py): the runtime protocol both
runtimes provide, and no replica module reaching into a runtime's private state."""

import pathlib
import re

from popxl_core.sim.batching import ReplicaRuntime
from popxl_core.sim.fold import FoldPlan, FoldRuntime
from popxl_core.sim.runtime import Runtime

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
