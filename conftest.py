"""Suite-wide set-up: one torch thread, and the names the docstring examples of the product
packages use (`pytest --doctest-modules`)."""

import gc
import os
import sys
import types

import pytest

# One torch thread for the tests and the processes they start (OMP_NUM_THREADS is inherited).
# The suite's tensors are small: a second thread saves little on an idle 2-core machine, and
# on a loaded one its OpenMP barriers spin while the other thread waits for a core (measured
# on the shared machine at load 10: test_fx_replication + test_fx_accumulation took 225 s of
# CPU with 2 threads, 30 s with 1). Every comparison runs both sides in one process, so with
# the same thread count; the tests of thread-count invariance set their own counts.
# POPXL_FX_TEST_THREADS=N runs the suite with N threads.
THREADS = int(os.environ.setdefault("POPXL_FX_TEST_THREADS", "1"))
os.environ["OMP_NUM_THREADS"] = str(THREADS)


def _runs_tests(config) -> bool:
    """False in pytest-xdist's controller (setup.cfg -n 2), which only hands tests to the
    workers and runs none (nor imports the product: `_rebuild_warnings_without_imports`)."""
    return hasattr(config, "workerinput") or not config.getoption("numprocesses", None)


# Python's cyclic garbage collector took 16 % of a test process's CPU (4.9 of 30 s over four
# fx test files): each full collection walks every object torch and the collected tests hold.
# Those are frozen out of collection once collected, and the young generation is collected
# every 10,000 allocations instead of 700 (same files: 30 -> 25 s of CPU; peak memory did not
# grow: 2.3 GB before, 2.1 GB after).
GC_THRESHOLD = (10_000, 20, 20)


def pytest_configure(config):
    if _runs_tests(config):
        import torch

        torch.set_num_threads(THREADS)
        gc.set_threshold(*GC_THRESHOLD)
    else:
        _rebuild_warnings_without_imports()


# The xdist controller rebuilds each warning a worker reports from its class's module and name
# (xdist.workermanage.unserialize_warning_message), importing that module, in the thread that
# reads that worker. Two such threads first importing popxl_core's modules at once (say
# `sim.checks` and `ir`, each taking its own module's lock and then the package's) deadlocked:
# "deadlock detected by _ModuleLock", the worker lost, the run ended in an INTERNALERROR.
# Importing popxl_core and popxl_fx in the controller first cost 2.5 s of CPU (torch's import)
# in a process that runs no test. The controller only prints the warnings it receives (the
# summary: "file:line: ClassName: message"; workers apply the -W filters), so a class not
# already loaded here is rebuilt as a stand-in: a UserWarning subclass of the same module and
# name, holding the worker's text of the message, which prints what the original prints.
_STAND_INS = types.ModuleType("conftest_warning_stand_ins")
sys.modules[_STAND_INS.__name__] = _STAND_INS


def _stand_in(module: str, name: str) -> str:
    """The attribute of `_STAND_INS` holding the stand-in for ``module.name``."""
    attr = f"{module}:{name}"  # two modules may each define a class of one name
    if not hasattr(_STAND_INS, attr):
        attrs = {"__module__": module, "__qualname__": name}
        setattr(_STAND_INS, attr, type(name, (UserWarning,), attrs))
    return attr


def unserialize_warning(data: dict, rebuild) -> object:
    """``rebuild(data)`` (xdist's function) with every class whose module is not loaded in
    this process replaced by its stand-in: nothing is imported."""
    data = dict(data)
    for key in ("message", "category"):
        module = data[f"{key}_module"]
        if module and module not in sys.modules:
            data[f"{key}_class_name"] = _stand_in(module, data[f"{key}_class_name"])
            data[f"{key}_module"] = _STAND_INS.__name__
            if key == "message":  # the text the worker printed, whatever the class's __init__
                data["message_args"] = [data["message_str"]]
    return rebuild(data)


def _rebuild_warnings_without_imports() -> None:
    from xdist import workermanage

    rebuild = workermanage.unserialize_warning_message
    workermanage.unserialize_warning_message = lambda data: unserialize_warning(data, rebuild)


def pytest_collection_finish(session):
    if _runs_tests(session.config):
        gc.freeze()  # imports and collected tests live until the end: no need to rescan them


@pytest.hookimpl(tryfirst=True)
def pytest_unconfigure(config):
    """With pytest-xdist, freeze what is alive before the last garbage collections: pytest's
    unraisable-exception plugin collects once more at the end, and so does Python as it
    exits; each walked everything still held (a worker: the test modules' caches; the
    controller: every test's reports). Measured on the whole suite: the last worker's end
    1.9 -> 0.45 s, the controller's exit 0.8 -> 0.2 s. Nothing that could be reported is
    lost: the controller runs none of the tests' code, and stops reading a worker's reports
    once the worker says its session finished. Without xdist (-n 0) nothing changes."""
    if hasattr(config, "workerinput") or config.getoption("numprocesses", None):
        gc.freeze()


# The test modules that take longest (subprocess jobs, many programs built), heaviest first:
# they run before the rest, so that with two workers (setup.cfg: -n 2 --dist loadscope
# --no-loadscope-reorder, a module a unit) neither worker starts one of them while the other
# is finishing; the many small modules and the doctests after them even out the two. The
# subprocess jobs lead (their children run beside the other worker's tests); then the rest by
# their seconds in one loaded whole-suite run (--durations=0 summed per module, load 10:
# 160, 122, 84, 37, 29, 26, 26, 25, 23 + 20 (one unit: `SHARED_IMPORTS`), 22 and 21 s).
HEAVY_FIRST = (
    "test_distributed.py",
    "test_seeds.py",
    "test_poptorch_compat_children.py",
    "test_fx_replication.py",
    "test_fx_memory_auto_containers.py",
    "test_fx_phased_accumulation.py",
    "test_fx_core_aten.py",
    "test_fx_outline.py",
    "test_fx_phased.py",
    "test_fx_outline_optimizer.py",
    "test_fx_batch_serialisation.py",
    "test_fx_hf.py",
    "test_fold_group.py",
)


# Test modules that import a large optional package of their own, grouped so that one worker
# runs all of a group's modules and imports the package once (setup.cfg: --dist loadscope hands
# each group out as one unit): transformers (~0.85 s of CPU with its GPT2 classes; the HF
# models and the GPT2 example of docs/popxl_fx.md), matplotlib (~0.45 s; the liveness plots),
# torch._inductor (~1 s beyond the torch._dynamo that any torch optimizer imports; the fast mode's
# tests, the only ones that compile with it).
SHARED_IMPORTS = {
    "test_inductor_kernels.py": "torch._inductor",
    "test_inductor_step.py": "torch._inductor",
    "test_inductor_trace.py": "torch._inductor",
    "test_fx_hf.py": "transformers",
    "test_fx_hf_exact.py": "transformers",
    "test_fx_hf_more.py": "transformers",
    "test_poptorch_custom_outputs.py": "transformers",
    "test_docs.py": "transformers",
    "test_examples_sim_report.py": "matplotlib",
    "test_examples_phased_report.py": "matplotlib",
    "test_sim_report.py": "matplotlib",
    "test_sim_planning.py": "matplotlib",  # popxl_core.report.main plots the liveness
    # not an import but a cache: the unfolded reference runs (`_off`, one per model and replica
    # count) that these modules share; each worker running some of them built them again
    "test_replica_folding.py": "tests.test_replica_folding._off",
    "test_replica_fold_reduce.py": "tests.test_replica_folding._off",
    "test_replica_fold_linear.py": "tests.test_replica_folding._off",
    "test_fold_group.py": "tests.test_replica_folding._off",
}


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupedScopes(LoadScopeScheduling):
        """loadscope's units (a test module, or a class), with `SHARED_IMPORTS`'s modules
        merged into one unit per package."""

        def _split_scope(self, nodeid: str) -> str:
            group = SHARED_IMPORTS.get(nodeid.split("::", 1)[0].rsplit("/", 1)[-1])
            return f"shared imports: {group}" if group else super()._split_scope(nodeid)

    return GroupedScopes(config, log)


# With --doctest-modules (setup.cfg) every .py file under testpaths is also collected for its
# docstring examples. A module with no ">>>" in its text has none, but pytest's doctest finder
# would still walk every object it defines and look up each one's source lines: over the 282
# product modules (29 with examples) ~1.1 s of CPU per xdist worker, over the 269 modules of
# tests/ (none with examples) most of their 4.6 s of collection in one process; a helper module
# such as tests/dist_workers.py was imported for it alone (0.6 s: popxl_fx.poptorch). Such a
# file keeps its test module (when it is one) and loses its doctest module.


@pytest.hookimpl(wrapper=True)
def pytest_collect_file(file_path, parent):
    collected = yield
    if file_path.suffix != ".py" or ">>>" in file_path.read_text(encoding="utf-8"):
        return collected
    return [node for node in collected if type(node).__name__ != "DoctestModule"]


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(HEAVY_FIRST)))  # stable


@pytest.fixture(scope="session", autouse=True)  # doctest_namespace is per session: set once
def _doctest_names(doctest_namespace):
    import numpy as np
    import torch
    from torch import nn

    import addons
    import popxl_core
    import popxl_fx

    doctest_namespace.update(
        np=np,
        torch=torch,
        nn=nn,
        popxl=popxl_core,
        popxl_core=popxl_core,
        addons=addons,
        popxl_fx=popxl_fx,
    )
