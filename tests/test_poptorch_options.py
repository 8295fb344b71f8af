"""`poptorch.Options` as PopTorch's python/options.py keeps it: values by PopTorch's names,
printing, copying, freezing, JSON and file presets, and the backend's check of `toDict`."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import popxl_fx.poptorch as poptorch
from popxl_fx.poptorch import options as options_module
from popxl_fx.poptorch.enums import ConnectionType, MeanReductionStrategy, OutputMode


def test_json_preset_from_the_environment_equals_the_setters(monkeypatch):
    by_setters = poptorch.Options().deviceIterations(2).connectionType(ConnectionType.OnDemand)
    by_setters.Precision.enableFloatingPointExceptions(True)
    by_setters._Popart.set("saveInitializersToFile", "my_file.onnx")
    preset = (
        '{"deviceIterations": 2, "connectionType": "ConnectionType.OnDemand", '
        '"Precision.enableFloatingPointExceptions": true, '
        '"_Popart.set": ["saveInitializersToFile", "my_file.onnx"]}'
    )
    monkeypatch.setenv("POPTORCH_DEFAULT_OPTIONS", preset)
    from_env = poptorch.Options()
    assert repr(from_env) == repr(by_setters)
    assert from_env.connection_type is ConnectionType.OnDemand
    monkeypatch.delenv("POPTORCH_DEFAULT_OPTIONS")
    assert repr(poptorch.Options()) != repr(from_env)


def test_values_read_back_by_poptorchs_names():
    opts = poptorch.Options().replicationFactor(4).useOfflineIpuTarget()
    opts.TensorLocations.setWeightLocation(
        poptorch.TensorLocationSettings().useOnChipStorage(False)
    )
    opts.Precision.setPartialsType(torch.half)
    assert opts.TensorLocations.location_weight == {"onChip": 0}
    assert opts._Popart.options["partialsTypeMatMuls"] == "half"
    assert (opts.log_dir, opts.connection_type, opts.ipu_version) == (".", ConnectionType.Never, 2)
    assert repr(opts).startswith("Options(") and "replication_factor=4" in repr(opts)
    assert opts.random_seed is None and opts.randomSeed(3).random_seed == 3


def test_validate_options_as_the_backend():
    opts = poptorch.Options().outputMode(OutputMode.All).enableSyntheticData(True)
    opts.setExecutionStrategy(poptorch.ShardedExecution()).maxRepeatLogs(None)
    opts._Popart.setPatterns({"PadSum": True}, 0)
    poptorch.poptorch_core._validateOptions(opts.toDict())
    assert opts.toDict()["execution_mode"] == 1 and opts.toDict()["syntheticDataMode"] == 2
    unknown = copy.deepcopy(opts)._Popart.set("asdfasdf", True)
    with pytest.raises(poptorch.Error, match="Unknown bool option asdfasdf"):
        poptorch.poptorch_core._validateOptions({**opts.toDict(), **unknown.options})
    with pytest.raises(poptorch.Error, match="Unknown value type Tensor for option dotChecks"):
        poptorch.poptorch_core._validateOptions({"dotChecks": torch.empty(1, 1)})
    with pytest.raises(AssertionError, match="An output mode must be picked"):
        poptorch.Options().toDict()


def test_load_from_file_runs_each_line(tmp_path):
    path = tmp_path / "opts.conf"
    path.write_text("deviceIterations(3)\n  replicationFactor(2) # why\n\n# a comment\n")
    opts = poptorch.Options()
    opts.loadFromFile(str(path))
    assert (opts.device_iterations, opts.replication_factor) == (3, 2)
    path.write_text("deviceIterations(1)\noutputMode(poptorch.OutputMode.All")
    with pytest.raises(options_module.ConfigFileError, match="SyntaxError at line 2 of opts.conf"):
        opts.loadFromFile(str(path))


def test_deep_copy_is_unfrozen_and_independent():
    opts = poptorch.Options().deviceIterations(5)
    opts.anchorTensor("t1", "tensor1", OutputMode.EveryN, 2)
    opts._Popart.set("autoRecomputation", 3)
    opts._freeze()
    twin = copy.deepcopy(opts)
    twin.deviceIterations(4)._Popart.set("autoRecomputation", 2)
    twin.Distributed.configureProcessId(2, 15)
    assert opts.anchored_tensors["t1"] == ["tensor1", False, OutputMode.EveryN, 2]
    assert (opts.device_iterations, opts._Popart.options["autoRecomputation"]) == (5, 3)
    assert opts.Distributed.distributed_process_id == 0
    with pytest.raises(AttributeError, match="frozen"):
        opts._Popart.set("autoRecomputation", 1)
    with pytest.raises(AttributeError, match="frozen"):
        opts.set(device_iterations=2)


def test_setter_checks_as_poptorch():
    opts = poptorch.Options()
    with pytest.raises(AssertionError, match="numIOTiles must be an even number"):
        opts.TensorLocations.numIOTiles(33)
    with pytest.raises(AssertionError, match="Invalid option"):
        opts.set(not_an_option=1)

    class Wrapped(options_module._DistributedOptions):
        pass

    opts.Distributed.__class__ = Wrapped  # popdist wraps the group this way
    assert isinstance(opts.Distributed, Wrapped)


def test_executor_options_are_frozen_and_take_the_optimizers_mean_strategy():
    model = nn.Linear(2, 2)
    half_accum = poptorch.optim.SGD(model.parameters(), lr=0.1, accum_type=torch.float16)
    training = poptorch.trainingModel(model, poptorch.Options(), half_accum)
    strategy = training.options.Training.meanAccumulationAndReplicationReductionStrategy
    assert strategy == MeanReductionStrategy.Running
    with pytest.raises(AttributeError, match="frozen"):
        training.options.set(random_seed=42)
    opts = poptorch.Options()
    opts.anchorTensor("t", "tensor")
    with pytest.raises(poptorch.Error, match="PopART name"):
        poptorch.inferenceModel(nn.Linear(2, 2), opts)


def test_is_running_on_ipu_inside_the_executor_only():
    class Net(nn.Module):
        def forward(self, x, y):
            return x + y if poptorch.isRunningOnIpu() else x * y

    x, y = torch.tensor([50]), torch.tensor([2])
    assert poptorch.inferenceModel(Net())(x, y) == 52 and Net()(x, y) == 100


def test_offline_device_asserts_on_a_call():
    model = poptorch.inferenceModel(nn.Linear(2, 2), poptorch.Options().useOfflineIpuTarget())
    model.compile(torch.ones(1, 2))
    with pytest.raises(AssertionError, match="Trying to run a model on an offline device"):
        model(torch.ones(1, 2))
