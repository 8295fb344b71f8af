"""Devices as PopART's DeviceManager and PopXL's ``_to_device_info`` hand them out (Graphcore's
test_util.create_test_device, test_session_set_device): CPU and IPU Model devices of the
simulator, none of IPU hardware; a Session given a device by ``_set_device`` checks on attach
that it is the kind and size the Session was built for."""

from __future__ import annotations

import pytest

import popxl_core as popxl
from popxl_core import compat_popart, ops
from popxl_core.utils import _to_device_info


def _session(kind: str, replicas: int = 1):
    ir = popxl.Ir(replication=replicas)
    with ir.main_graph:
        s = popxl.h2d_stream((), popxl.float32)
        ops.host_store(popxl.d2h_stream((), popxl.float32), ops.host_load(s) + 1)
    return popxl.Session(ir, kind)


def test_device_manager_of_the_simulator():
    dm = compat_popart.DeviceManager()
    model = dm.createIpuModelDevice({"numIPUs": 2, "tilesPerIPU": 4, "ipuVersion": "ipu2"})
    assert (model.type, model.numIpus, model.tilesPerIPU) == ("IpuModel", 2, 4)
    assert dm.createCpuDevice().type == "Cpu"
    assert dm.enumerateDevices(numIpus=1) == [] and dm.acquireAvailableDevice(1) is None
    with model as attached:
        assert attached.isAttached
    assert not model.isAttached
    with pytest.raises(RuntimeError, match="no IPU hardware"):
        _to_device_info("ipu_hw")


@pytest.mark.parametrize(
    "built, device, ok",
    [("ipu_model", "ipu_model", True), ("ipu_hw", "ipu_model", False), ("cpu", "cpu", True)],
)
def test_set_device_checks_the_kind(built, device, ok):
    session = _session(built)
    session._set_device(_to_device_info(device))
    if ok:
        with session:
            pass
    else:
        with pytest.raises(ValueError, match="runs only on the target it was compiled for"):
            with session:
                pass


def test_set_device_checks_the_ipus():
    session = _session("ipu_model", replicas=2)
    session._set_device(_to_device_info("ipu_model", 1))
    with pytest.raises(ValueError, match="with 2 IPU"):
        with session:
            pass
    session._set_device(_to_device_info("ipu_model", 2))
    with session:
        pass


def test_session_built_for_a_device():
    """PopXL's Session(ir, device): built for the device's kind, and runs on it."""
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(1.0, popxl.float32)
        out = popxl.d2h_stream(v.shape, v.dtype)
        ops.host_store(out, v)
    device = compat_popart.DeviceManager().createIpuModelDevice({"numIPUs": 1})
    with popxl.Session(ir, device) as sess:
        assert sess.device_desc == "ipu_model" and sess.run()[out] == 1.0


def test_peer_suites_conftest_sets_popart_test_target(monkeypatch):
    """tools/peer_suites.py's conftest sets TEST_TARGET as popart's ctest does (the device
    helpers of Graphcore's tests read it), unless the caller set it."""
    import importlib.util

    from popxl_core import compat
    from tests.test_compat import _project_bindings, _restore

    bindings = _project_bindings()
    spec = importlib.util.spec_from_file_location("peer_suites", "tools/peer_suites.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    monkeypatch.delenv("TEST_TARGET", raising=False)
    try:
        exec(compile(tool._CONFTEST.format(timeout=5), "conftest.py", "exec"), {})
        assert __import__("os").environ["TEST_TARGET"] == "IpuModel2"
        monkeypatch.setenv("TEST_TARGET", "Cpu")
        exec(compile(tool._CONFTEST.format(timeout=5), "conftest.py", "exec"), {})
        assert __import__("os").environ["TEST_TARGET"] == "Cpu"
    finally:
        compat.uninstall()
        _restore(bindings)
