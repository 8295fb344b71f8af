"""popxl_core.compat: PopXL / popxl.addons import paths resolve to this project.

Scripts run as ``python -m popxl_core.compat SCRIPT ARGS`` would, but in this process
(`compat.main`): ImportWarnings are errors (as ``-W error::ImportWarning``), and afterwards the
hook and every alias are removed (`compat.uninstall`, itself tested below), as are the modules
the script imported from its own folder, and sys.argv and sys.path are restored, so nothing
leaks into the other tests.
"""

from __future__ import annotations

import contextlib
import io
import sys
import textwrap
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

from popxl_core import compat


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def _main(argv: list[str], cwd: Path) -> Ran:
    """``python -m popxl_core.compat ARGV`` in this process: exit code, stdout, stderr."""
    out, err, code = io.StringIO(), io.StringIO(), 0
    before = set(sys.modules)
    bindings = _project_bindings()
    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings():
        warnings.simplefilter("error", ImportWarning)
        patch.setattr(sys, "argv", list(sys.argv))  # compat.main sets the script's argv
        patch.setattr(sys, "path", list(sys.path))  # and puts the script's folder first
        patch.chdir(cwd)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                compat.main(argv)
        except SystemExit as stop:  # as the interpreter turns it into an exit code
            code = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
            if isinstance(stop.code, str):
                err.write(stop.code + "\n")
        except Exception:  # an uncaught error: a traceback and exit code 1
            code = 1
            err.write(traceback.format_exc())
        finally:
            compat.uninstall()
            _restore(bindings)
            for name in set(sys.modules) - before:  # the script's own modules (helper.py)
                if str(cwd) in str(getattr(sys.modules[name], "__file__", None) or ""):
                    del sys.modules[name]
    return Ran(code, out.getvalue(), err.getvalue())


def _project_bindings() -> dict:
    """Every attribute of the project's loaded modules, to restore after a script."""
    return {
        name: dict(vars(module))
        for name, module in list(sys.modules.items())
        if module is not None and name.split(".")[0] in ("popxl_core", "addons", "popxl_fx")
    }


def _restore(bindings: dict) -> None:
    """Rebind what a script's imports rebound: importing an alias such as
    ``popxl_addons.seed_variable`` for the first time binds the module over the package's
    function of that name, as it would in the script's own process."""
    for name, names in bindings.items():
        module = sys.modules.get(name)
        current = vars(module) if module is not None else {}
        for key, value in names.items():
            if key in current and current[key] is not value:
                setattr(module, key, value)


def _run(tmp_path: Path, source: str, *args: str, check: bool = True, files=None) -> Ran:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    for name, text in (files or {}).items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    proc = _main([str(script), *args], tmp_path)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


IMPORTS = """
import sys
import popxl
import popxl.ops
from popxl import ops
from popxl.ops.call import CallSiteInfo
from popxl.ops.utils import check_in_graph, check_tensor_ipu_and_tile_set, convert_optional_float
from popxl.ops.negative_log_likelihood import REDUCTION_TYPE
from popxl.ops.conv import PadType
from popxl.ops import var_updates
from popxl.transforms.autodiff import (ExpectedConnection, ExpectedConnectionType,
                                       GradGraphInfo, autodiff)
from popxl.tensor import (Constant, HostTensor, Tensor, TensorByRef, Variable, graph_input,
                          host_tensor_types)
from popxl.context import (debug_context_frame_offset, get_current_context,
                           get_current_graph, op_debug_context)
from popxl.dtypes import _NP_TO_POPXL, _PT_TO_POPXL, dtype, np_dtype_float8_143
from popxl.streams import DeviceToHostStream, HostToDeviceStream
from popxl.session import Session
from popxl.utils import downcast_np_dtypes, table_to_string, to_numpy
from popxl.graph import Graph
from popxl.ir import Ir
from popxl.replica_grouping import ReplicaGrouping
from popxl.errors import UndefinedValue
from popxl.random_seed import create_seeds
from popxl.testing import get_all_dtypes, get_all_int_dtypes
from popxl.module import Module
import popxl_addons as addons
from popxl_addons.named_tensors import NamedTensorData, NamedTensors, print_named_tensors
from popxl_addons.dot_tree import DotTree
from popxl_addons.variable_factory import NamedVariableFactories, VariableFactory
from popxl_addons.graph import BoundGraph, GraphWithNamedArgs
from popxl_addons.module import Module as AddonsModule
from popxl_addons.graph_cache import GraphCache
from popxl_addons.transforms import autodiff as addons_autodiff, autodiff_with_accumulation
from popxl_addons.transforms.autodiff import autodiff as addons_autodiff2
from popxl_addons.layers import Conv2D, Embedding, GroupNorm, LayerNorm, Linear
from popxl_addons.optimizers.adam import AdamOptimizerStep
from popxl_addons.ops import cross_entropy, cross_entropy_with_grad, host_load, host_store
from popxl_addons.utils import OrderedDict
from popxl_addons import (batch_serialise, batch_serialise_fwd_and_grad, batch_serial_buffer,
                          named_variable_buffers, load_remote_graph, store_remote_graph)
from popxl_addons.transforms.batch_serialisation import BatchSerialResult, RemoteHandle
from popxl_addons.remote import NamedRemoteBuffers, named_buffers, load_remote, store_remote
from popxl_addons.rts import (all_gather_replica_sharded_graph, reduce_replica_sharded_graph,
                              replica_sharded_spec)
from popxl_addons.testing_utils import TensorInput, run_module
from popxl_addons.array_munging import shard, unshard, repeat
from popxl_addons.ops.replicated_all_reduce_TP.replicated_all_reduce_TP import (
    replicated_all_reduce_identical_inputs)
"""


def test_every_supported_path_imports_and_is_this_project(tmp_path):
    proc = _run(
        tmp_path,
        IMPORTS
        + """
import addons as real_addons, popxl_core
assert popxl is popxl_core and addons is real_addons
assert popxl.ops.call is popxl_core.ops.call and callable(popxl.ops.call)  # the op, not the module
assert popxl.ops.conv is popxl_core.ops.conv and callable(popxl.ops.conv)
assert Session is popxl.Session and Linear is real_addons.layers.Linear
assert AddonsModule is addons.Module and addons_autodiff is addons_autodiff2
assert popxl.__spec__.name == "popxl_core"  # aliasing leaves the real module intact
assert sys.modules["popxl.ops.call"] is sys.modules["popxl_core.ops.call"]
print(repr(popxl.float32))
print(repr(popxl.dtypes.float16))
""",
    )
    assert proc.stdout.splitlines() == ["popxl.dtypes.float32", "popxl.dtypes.float16"]


def test_popxl_ops_is_reachable_after_plain_import(tmp_path):
    proc = _run(
        tmp_path,
        """
import popxl
ir = popxl.Ir()
with ir.main_graph:
    a = popxl.constant(1.0, popxl.float32)
    print(popxl.ops.add(a, a).dtype)
""",
    )
    assert proc.stdout.strip() == "popxl.dtypes.float32"


def test_argv_main_and_script_directory(tmp_path):
    proc = _run(
        tmp_path,
        """
import sys
import helper  # a module next to the script, as with `python script.py`
print(__name__, sys.argv[1:], helper.VALUE, sys.argv[0].endswith("script.py"))
""",
        "--steps",
        "3",
        "x y",
        files={"helper.py": "VALUE = 42\n"},
    )
    assert proc.stdout.strip() == "__main__ ['--steps', '3', 'x y'] 42 True"


def test_script_errors_and_exit_codes_propagate(tmp_path):
    proc = _run(tmp_path, "import sys\nsys.exit(3)\n", check=False)
    assert proc.returncode == 3
    proc = _run(tmp_path, "import popxl.no_such_module\n", check=False)
    assert proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr
    assert "popxl.no_such_module" in proc.stderr


def test_usage_without_a_script(tmp_path):
    proc = _main([], tmp_path)
    assert proc.returncode != 0 and "usage" in proc.stderr


def test_popxl_addons_program_runs_unchanged(tmp_path):
    proc = _run(
        tmp_path,
        """
import numpy as np
import popxl
import popxl_addons as addons
from popxl_addons.layers import Linear
from popxl_addons.ops import host_store

np.random.seed(0)
x = np.random.rand(2, 3).astype(np.float32)
ir = popxl.Ir()
with ir.main_graph:
    facts, graph = Linear(4).create_graph(popxl.TensorSpec((2, 3), popxl.float32))
    variables = facts.init()
    (y,) = graph.bind(variables).call(popxl.variable(x, name="x"))
    stream = host_store(y)
session = popxl.Session(ir, "ipu_hw")
with session:
    out = session.run()[stream]
w, b = session.get_tensors_data([variables.weight, variables.bias]).values()
np.testing.assert_allclose(out, x @ w + b, rtol=1e-6)
print(stream.tensor_id, repr(y))
""",
    )
    assert proc.stdout.strip() == "add_out_stream Tensor[add_out popxl.dtypes.float32 (2, 4)]"


def test_install_and_uninstall_in_process():
    from popxl_core import compat

    try:
        compat.install()
        compat.install()  # idempotent
        assert sys.meta_path.count(compat._FINDER) == 1
        import popxl.ops.call

        import popxl_core

        assert sys.modules["popxl"] is popxl_core
        assert callable(sys.modules["popxl.ops"].call)
        assert popxl_core.__spec__.name == "popxl_core"
    finally:
        compat.uninstall()
    assert not [n for n in sys.modules if n.split(".")[0] in ("popxl", "popxl_addons")]
    with pytest.raises(ModuleNotFoundError):
        import popxl  # noqa: F401


def test_popart_stand_ins_and_module_paths(tmp_path):
    _run(
        tmp_path,
        """
        import popart
        import pytest
        import popxl
        from popxl_addons.transforms.repeat_graph import repeat_graph
        from popxl_addons.transforms.recomputation import recompute_graph
        from popxl_addons.ops.streams import host_load, host_store
        from popxl_addons.named_replica_grouping import NamedReplicaGrouping
        from popxl_addons.performance_utils import evaluate_FLOPs
        from popxl_addons.debugging import print_tensor
        from popxl_addons.seed_variable import seed_variable
        from popxl_addons.route_tensor import route_tensor_into_graph
        from popxl_addons.transforms import enable_fc_pass, disable_fc_pass
        from popxl_addons import set_available_memory_proportion_by_ipu
        from popxl_addons.task_session import TaskSession, write_variables_pb
        from popxl_addons.transforms.pipelining import pipelined_execution
        from popxl_addons.ops.fp8_amax_scale import fp8_amax_scale
        from popxl.fp8_utils import host_pow2scale_cast_to_fp8, host_fp8_mse_scale
        from popxl.dtypes import np_dtype_float8_143
        popart.getLogger().setLevel("DEBUG")
        ir = popxl.Ir()
        with ir.main_graph:
            with pytest.raises(popart.popart_exception):
                popxl.remote_buffer((2,), popxl.float32, entries=0)
        """,
    )
    # two popxl_addons paths name one module here (seed_variable, route_tensor): importing
    # them leaves the package's functions of those names in place
    import addons

    assert callable(addons.seed_variable) and callable(addons.route_tensor_into_graph)
