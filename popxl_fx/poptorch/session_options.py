"""PopTorch's check of a serialised `Options.toDict` (``poptorch_core._validateOptions``).

PopTorch's C++ backend takes each entry by its value's type (bool, float, int, string, a list
or set of strings, a dict) and looks its name up among the options of that type; a name it
does not know, or a value of no such type, is a `poptorch.Error`. The tables below are the
names PopTorch 3.3's backend knows, by type (its own options and PopART's session options).
"""

from __future__ import annotations

from .errors import Error

__all__ = ["validate_options"]

_BOOL = """auto_round_num_ipus use_model serial_phases_execution separate_backward_phase
broadcast_buffers enableExplicitIR aliasZeroCopy automaticLossScalingSettings.enabled
batchSerializationSettings.concatOnExecutionPhaseChange
batchSerializationSettings.concatOnPipelineStageChange
batchSerializationSettings.concatOnVirtualGraphChange compileEngine constantWeights
decomposeGradSum delayVarUpdates disableGradAccumulationTensorStreams
disableOptimizerStateTensorStreams dotOpNames enableDistributedReplicatedGraphs
enableEngineCaching enableExplicitMainLoops enableFloatingPointChecks enableFullyConnectedPass
enableGradientAccumulation enableInplaceAmbiguityChecking enableLoadAndOffloadRNGState
enableMergeExchange enableNonStableSoftmax enableOutlining enableOutliningCopyCostPruning
enablePipelining enablePrefetchDatastreams enableReplicatedGraphs enableSerializedMatmuls
enableStableNorm enableStochasticRounding enableSupportedDataTypeCasting
ensureFp32LossScaleTensor explicitRecomputation exportPoplarComputationGraph
exportPoplarVertexGraph groupHostSync groupNormStridedChannelGrouping
instrumentWithHardwareCycleCounter opxAliasChecking opxModifyChecking rearrangeAnchorsOnHost
rearrangeStreamsOnHost replicatedCollectivesSettings.mergeAllReduceCollectives
replicatedCollectivesSettings.prepareScheduleForMergingCollectives
scheduleNonWeightUpdateGradientConsumersEarly separateCallOpPdfs strictOpVersions
useHostCopyOps"""

_UINT64 = """device_iterations num_distributed_processes distributed_process_id ipu_version ipu_id
gradient_accumulation output_return_period replication_factor input_group_size input_cgt
execution_mode tensors_liveness output_mode connection_type max_repeat_logs
accumulation_and_replication_reduction_type sync_pattern random_seed
accumulateOuterFragmentSettings.schedule accumulationAndReplicationReductionType
accumulationFactor autoRecomputation autodiffSettings.stitchStrategy
automaticLossScalingSettings.gradientTensorTrackingMethod
automaticLossScalingSettings.updatePeriod batchSerializationSettings.batchSchedule
batchSerializationSettings.factor batchSerializationSettings.method
batchSerializationSettings.transformContext compilationProgressTotal defaultBufferingDepth
defaultPrefetchBufferingDepth executionPhaseSettings.phases executionPhaseSettings.stages
finalDotOp firstDotOp globalReplicaOffset globalReplicationFactor looseThresholdAtPeak
meanAccumulationAndReplicationReductionStrategy mergeVarUpdate mergeVarUpdateMemThreshold
numIOTiles subgraphCopyingStrategy swapLimitScheduler syntheticDataMode
transitiveClosureOptimizationThreshold virtualGraphMode"""

_DOUBLE = """automaticLossScalingSettings.binEdgeLocation
automaticLossScalingSettings.thresholdUpperCountProportion outlineSequenceBreakCost
outlineThreshold timeLimitScheduler"""

_STRING = """log_dir logDir model_name saveInitializersToFile cachePath customCodeletCompileFlags
kahnTieBreaker partialsTypeMatMuls serializedPoprithmsShiftGraphsDir"""

_CONTAINER = """accumulateOuterFragmentSettings.excludedVirtualGraphs convolutionOptions
customCodelets dotChecks engineOptions gclOptions hardwareInstrumentations lstmOptions
matmulOptions reportOptions updatableNamedBuffers"""

_KNOWN = {
    "bool": frozenset(_BOOL.split()),
    "uint64": frozenset(_UINT64.split()),
    "floating point": frozenset(_DOUBLE.split()),
    "string": frozenset(_STRING.split()),
    "set / vector": frozenset(_CONTAINER.split()),
    "map": frozenset(_CONTAINER.split()),
}
# entries the backend handles apart from the tables (PopTorch's Python or special parsing)
_SPECIAL = frozenset(["patterns_level", "anchored_tensors", "compilation_progress_bar_fn"])
_SPECIAL_DICTS = frozenset(["available_memory_proportion", "patterns"])


def validate_options(options: dict) -> None:
    """Raise `poptorch.Error` for an entry PopTorch's backend would refuse."""
    for name, value in options.items():
        if name in _SPECIAL:
            continue
        kind = _kind(name, value)
        if kind is not None and name not in _KNOWN[kind]:
            raise Error(f"Unknown {kind} option {name}")
    if "patterns" in options and "patterns_level" not in options:
        raise Error(
            "PopART option 'patterns' should not be set without first setting 'patterns_level'."
        )


def _kind(name: str, value) -> str | None:
    """The table a value is looked up in (None: parsed apart, or nothing to look up)."""
    if isinstance(value, bool):
        return "bool"
    for kind, types in (("floating point", float), ("uint64", int), ("string", str)):
        if isinstance(value, types):
            return kind
    if isinstance(value, (list, tuple, set)):
        return "set / vector" if value else None
    if isinstance(value, dict):
        special = name in _SPECIAL_DICTS or name.startswith("location_") or not value
        return None if special else "map"
    raise Error(f"Unknown value type {type(value).__name__} for option {name}")
