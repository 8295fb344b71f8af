"""``memory="auto"`` traces the model once per input signature (#38, #39: build time).

The decoder of examples/fx_phased.py (4 blocks of width 64, AdamW) does not fit
``device="ipu_model"`` as given; ``memory="auto"`` plans the options as given, phases of the
blocks and of the top-level children, outlining with recomputation, accumulation over 2 and 4
micro-batches, then builds the chosen phases of the blocks. Before the builds shared their
captures (`popxl_fx.capture_cache`) each build traced again what an earlier one had traced:
the whole model at the full batch twice (the options as given, outlining), the split into the
blocks' phases twice and each of its 6 pieces twice (the candidate, the chosen build): 26
captures and splits where 18 now do. The search for the blocks is made once too
(`phased._phase_paths`), and the blocks' split reuses that search's trace
(`phases.phase_plan`). The candidates that trace other inputs (a micro-batch) or another
split (the children's phases) still trace their own.
"""

from __future__ import annotations

import collections

import pytest
import torch
import torch.utils._pytree as pytree
from torch import fx

import popxl_fx
import popxl_fx.module
import popxl_fx.phased
import popxl_fx.pipeline
from examples.fx_phased import Decoder
from popxl_fx.capture_cache import SharedCaptures
from popxl_fx.example_values import _NO_TENSORS

VOCAB, CONTEXT = 64, 16


def _shapes(examples) -> tuple:
    return tuple(tuple(x.shape) if isinstance(x, torch.Tensor) else repr(x) for x in examples)


def _traced(model) -> object:
    # a piece is a new graph module per split: the same piece has the same code
    return model.code if isinstance(model, fx.GraphModule) else id(model)


@pytest.fixture(scope="module")
def traces() -> collections.Counter:
    """Every whole-model or piece capture and every phased split, by what it traces, while
    `_auto_trainer`'s trainer builds (once for the module: the tests only read what it made)."""
    seen: collections.Counter = collections.Counter()
    seen.made = made = []  # type: ignore[attr-defined]  (the captures, in order)
    capture, split = popxl_fx.module.capture, popxl_fx.phased.split_pieces

    def counted_capture(model, examples, *args):
        seen["capture", _traced(model), _shapes(examples)] += 1
        captured = capture(model, examples, *args)
        made.append(captured)
        return captured

    def counted_split(root, examples, paths, *args):
        seen["split", id(root), _shapes(examples), tuple(paths)] += 1
        return split(root, examples, paths, *args)

    stage_plan = popxl_fx.pipeline.Build._plan
    seen.stage_plans = stage_plans = []  # type: ignore[attr-defined]  (plan_only, per plan)

    def counted_stage_plan(build):
        stage_plans.append(build.plan_only)
        return stage_plan(build)

    find_paths = popxl_fx.phased.phase_plan
    seen.paths = paths = collections.Counter()  # type: ignore[attr-defined]  (phase_plan)

    def counted_paths(root, spec, examples, *args):
        paths[id(root), spec, _shapes(examples)] += 1
        return find_paths(root, spec, examples, *args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(popxl_fx.phased, "phase_plan", counted_paths)
        patch.setattr(popxl_fx.module, "capture", counted_capture)
        patch.setattr(popxl_fx.phased, "split_pieces", counted_split)
        patch.setattr(popxl_fx.pipeline.Build, "_plan", counted_stage_plan)
        trainer, batch = _auto_trainer()
        trainer.build(*batch)
    seen.trainer = trainer  # type: ignore[attr-defined]
    return seen


def _auto_trainer() -> tuple:
    torch.manual_seed(0)
    model = Decoder(VOCAB, CONTEXT, 64, 4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, eps=1e-6)
    options = popxl_fx.Options(device="ipu_model", memory="auto")
    g = torch.Generator().manual_seed(1)
    batch = [torch.randint(0, VOCAB, (4, CONTEXT), generator=g) for _ in range(2)]
    return popxl_fx.training_model(model, opt, options=options), batch


def test_auto_traces_each_model_split_and_piece_once_per_signature(traces):
    assert traces.trainer.options.phased_execution == "blocks"  # the candidates above were planned
    twice = {key: n for key, n in traces.items() if n > 1}
    assert not twice, f"traced more than once: {[(k[0], k[2], n) for k, n in twice.items()]}"
    assert sum(traces.values()) == 18  # 26 before the builds shared their captures


def test_auto_finds_each_phase_split_once_per_signature(traces):
    """The blocks' phases are found (a trace of their own, `outline.plan_outline`) once for
    the candidate and the chosen build, as the split and the pieces are traced once."""
    assert traces.paths and max(traces.paths.values()) == 1, traces.paths


def test_the_shared_captures_keep_no_example_values_once_built(traces):
    # the what-if builds left the shared captures' values real; the chosen build's end forgot
    examples = [x for captured in traces.made for x in captured.example_inputs]
    assert examples and all(x.is_meta for x in examples if isinstance(x, torch.Tensor))


def test_shared_captures_make_once_per_owner_and_key_and_forget_their_examples():
    shared, made = SharedCaptures(), []
    owner, other = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    make = lambda: made.append(1) or fx.symbolic_trace(owner)
    first = shared.get(("k",), owner, make)
    assert shared.get(("k",), owner, make) is first and len(made) == 1
    assert shared.get(("k",), other, make) is not first and shared.get(("j",), owner, make)
    assert shared.made == len(made) == 3
    assert shared.holds(first) and shared.unshared([first, owner]) == [owner]
    shared.forget()
    assert not shared.holds(first)


def test_the_annotations_forget_examples_skips_hold_no_tensor(traces):
    """`example_values._NO_TENSORS` names the node annotations `forget_examples` does not walk:
    none of them may hold a tensor (it would stay alive with its data)."""
    metas = [node.meta for captured in traces.made for node in captured.gm.graph.nodes]
    skipped = [(key, m[key]) for m in metas for key in sorted(_NO_TENSORS) if key in m]
    # these models are closed (no second trace, so no module states) and data-independent:
    # the other four appear, so the check sees them
    seen = {key for key, _ in skipped}
    assert seen == _NO_TENSORS - {"module_state", "data_dependent"}, seen
    held = [key for key, value in skipped if any(map(torch.is_tensor, pytree.tree_leaves(value)))]
    assert not held, held


def test_only_the_chosen_build_plans_its_stages(traces):
    """The what-if builds of the candidates plan once each, at their end (`Build.plan`):
    their stage records are never read, so no stage of theirs is planned (they took 5 % of
    test_fx_memory_auto_containers's CPU). The chosen build's stages are."""
    assert traces.stage_plans and not any(traces.stage_plans), traces.stage_plans
