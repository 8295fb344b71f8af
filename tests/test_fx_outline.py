"""Options(outline=..., recompute=...) on traced models (issue 16), each against the plain
(inlined) program on the simulator.

Outlining moves the same ops, with the same kernels, into a block graph called once per block,
and recompute runs the block's forward again in its backward: neither changes the arithmetic,
so the comparisons here are bitwise (rtol=0, atol=0) -- losses, final parameters, buffers
(batch-norm running statistics) and optimizer state after 3 steps. The one exception is a
block given the same tensor twice: that tensor's gradient sums the two in another order
(float32 round-off, measured and stated where it is tested).
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from popxl_fx import Options, compile, inference_model, training_model
from popxl_fx.outline import OutlineError
from tests.fx_zoo import GPT, DecoderBlock

CPU = Options(device="cpu")
BITWISE = dict(rtol=0, atol=0)


def gpt6():
    torch.manual_seed(0)
    model = GPT(layers=6)
    g = torch.Generator().manual_seed(1)
    idx, targets = (torch.randint(0, 64, (2, 16), generator=g) for _ in range(2))
    return model, (idx, targets)


class BasicBlock(nn.Module):
    """A ResNet basic block: conv-bn-relu-conv-bn plus the identity."""

    def __init__(self, c):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + x)


class ResNetish(nn.Module):
    """A stem, a stage of 3 identical blocks, a strided conv, a stage of 2, and a head."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.stage1 = nn.Sequential(*[BasicBlock(8) for _ in range(3)])
        self.down = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.stage2 = nn.Sequential(*[BasicBlock(16) for _ in range(2)])
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        x = self.stage2(self.down(self.stage1(self.stem(x))))
        return self.head(x.mean(dim=(2, 3)))


def resnetish():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 3, 8, 8, generator=g)
    return ResNetish(), (x, torch.randint(0, 10, (4,), generator=g))


def train(model, inputs, options, steps=3, loss_fn=None):
    """``steps`` of SGD with momentum: losses, the trainer, the model's state and the
    optimizer's momentum buffers."""
    model = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    trainer = training_model(model, opt, loss_fn=loss_fn, options=options)
    losses = [trainer(*inputs) for _ in range(steps)]
    state = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    momenta = [s["momentum_buffer"] for s in opt.state_dict()["state"].values()]
    return losses, trainer, state, momenta


def assert_same_training(a, b, tol=BITWISE):
    (la, _, sa, ma), (lb, _, sb, mb) = a, b
    for x, y in zip(la, lb):
        torch.testing.assert_close(x, y, **tol)
    assert sa.keys() == sb.keys()
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], **tol, msg=k)
    for x, y in zip(ma, mb, strict=True):
        torch.testing.assert_close(x, y, **tol)


def block_calls(ir):
    """Graph name -> number of Call ops calling it, over every graph of ``ir``."""
    calls = {}
    for g in ir._graphs.values():
        for op in g._ops:
            if op.type == "Call":
                name = op.called_graphs[0].name
                calls[name] = calls.get(name, 0) + 1
    return calls


# the GPT-style decoder -------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpt_runs():
    model, inputs = gpt6()
    return {
        "plain": train(model, inputs, CPU),
        "outline": train(model, inputs, CPU.replace(outline="auto")),
        "recompute": train(model, inputs, CPU.replace(outline="auto", recompute=True)),
    }


def test_auto_outline_makes_one_block_graph_called_six_times(gpt_runs):
    ir = gpt_runs["outline"][1].ir
    calls = block_calls(ir)
    names = [g.name for g in ir._graphs.values()]
    assert names == [
        "",
        "Module_subgraph(0)",
        "DecoderBlock_subgraph(1)",
        "Module_subgraph(0)_bwd",
        "DecoderBlock_subgraph(1)_bwd",
        "optimizer_update_blocks_subgraph(2)",  # each block's SGD update (issue 34)
    ]
    blocks = [g for g in ir._graphs.values() if g.name == "DecoderBlock_subgraph(1)"]
    block = blocks[0]
    assert calls[block.name] == 6
    assert calls[f"{block.name}_bwd"] == 6  # the backward calls the block's grad graph
    # no DecoderBlock op is left inline in the model's forward graph
    forward = gpt_runs["outline"][1]._active.forward.graph
    inline = [op for op in forward._ops if (op.module_path or "").startswith("blocks.")]
    assert {op.type for op in inline} == {"Call"}
    assert all(op.module_path.startswith("blocks.*") for op in block._ops)
    # the plain program has no block graph at all
    assert not any("DecoderBlock" in n for n in block_calls(gpt_runs["plain"][1].ir))


def test_report_shows_the_code_bytes_saved(gpt_runs):
    plain = gpt_runs["plain"][1].report()
    outlined = gpt_runs["outline"][1].report()
    saving = outlined.outlining()
    assert saving.code_bytes == outlined.totals()["code_bytes"]
    assert saving.saved_bytes > 0
    assert saving.call_sites == {
        "DecoderBlock_subgraph(1)": 6,
        "DecoderBlock_subgraph(1)_bwd": 6,
        "optimizer_update_blocks_subgraph(2)": 6,
    }
    # inlining the outlined program gives back the plain program's code, less its 2 call ops
    # (main calls forward and backward) and less nothing else
    assert saving.inlined_code_bytes == plain.outlining().inlined_code_bytes
    assert outlined.totals()["code_bytes"] < plain.totals()["code_bytes"] / 1.8
    assert "Outlining: code" in outlined.summary()
    assert outlined.to_dict()["outlining"]["saved_bytes"] == saving.saved_bytes
    assert "Outlining" not in plain.summary()  # nothing is called twice there


def test_outlined_training_equals_inlined_bitwise(gpt_runs):
    assert_same_training(gpt_runs["plain"], gpt_runs["outline"])


def test_outline_with_recompute_equals_plain_bitwise(gpt_runs):
    assert_same_training(gpt_runs["plain"], gpt_runs["recompute"])


def test_recompute_lowers_activation_memory(gpt_runs):
    def peak(run):
        return run[1].report().totals()["not_always_live_peak_bytes"]

    assert peak(gpt_runs["recompute"]) < 0.7 * peak(gpt_runs["outline"])
    # the backward calls the recomputing graph once per block; it calls the block's forward
    # (the 7th call of it) and then the block's grad graph
    calls = block_calls(gpt_runs["recompute"][1].ir)
    assert calls["DecoderBlock_bwd_recomp_subgraph(2)"] == 6
    assert calls["DecoderBlock_subgraph(1)"] == 7
    assert calls["DecoderBlock_subgraph(1)_bwd"] == 1


def test_outline_by_names_and_by_class_equals_auto():
    model, inputs = gpt6()
    auto = train(model, inputs, CPU.replace(outline="auto"), steps=1)
    names = [f"blocks.{i}" for i in range(6)]
    for spec in (names, [DecoderBlock]):
        run = train(model, inputs, CPU.replace(outline=spec), steps=1)
        assert_same_training(auto, run)
        assert block_calls(run[1].ir)["DecoderBlock_subgraph(1)"] == 6


def test_listing_some_blocks_outlines_those_only(gpt_runs):
    model, inputs = gpt6()
    run = train(model, inputs, CPU.replace(outline=["blocks.1", "blocks.4"]))
    assert_same_training(gpt_runs["plain"], run)  # 3 steps, as the plain run
    assert block_calls(run[1].ir)["DecoderBlock_subgraph(1)"] == 2


# ResNet-style CNN with batch norm ---------------------------------------------------------
@pytest.fixture(scope="module")
def resnet_plain():
    """3 steps of the plain program: the reference of both outlined runs."""
    model, inputs = resnetish()
    return train(model, inputs, CPU, loss_fn=F.cross_entropy)


def test_resnet_blocks_outline_per_stage_bitwise_with_running_stats(resnet_plain):
    model, inputs = resnetish()
    plain = resnet_plain
    outlined = train(model, inputs, CPU.replace(outline="auto"), loss_fn=F.cross_entropy)
    assert_same_training(plain, outlined)  # the state includes running_mean/var
    calls = block_calls(outlined[1].ir)
    # one graph per stage: the 8- and 16-channel blocks differ in parameter shapes
    assert sorted(n for n in calls if not n.endswith("_bwd") and "BasicBlock" in n) == [
        "BasicBlock_subgraph(1)",
        "BasicBlock_subgraph(2)",
    ]
    assert calls["BasicBlock_subgraph(1)"] == 3 and calls["BasicBlock_subgraph(2)"] == 2


def test_resnet_recompute_updates_running_stats_once(resnet_plain):
    """The recomputed forward also runs batch norm; its statistics update must not reach the
    variables a second time."""
    model, inputs = resnetish()
    options = CPU.replace(outline="auto", recompute=True)
    recomputed = train(model, inputs, options, loss_fn=F.cross_entropy)
    assert_same_training(resnet_plain, recomputed)


# dropout: each call site draws from its own seed ----------------------------------------------
def test_dropout_blocks_recompute_the_same_masks():
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)) for _ in range(3)])
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    # the simulator's seeded stream (rng="ipu") replays a mask when a block is recomputed;
    # torch's generator would not, and recompute refuses it (tests/test_fx_random_torch.py)
    ipu = CPU.replace(outline="auto", rng="ipu")
    outline = train(model, (x, y), ipu, loss_fn=F.mse_loss)
    recompute = train(model, (x, y), ipu.replace(recompute=True), loss_fn=F.mse_loss)
    assert_same_training(outline, recompute)
    # the three blocks do not share a mask: their seeds differ
    seeds = [v for n, v in outline[1]._active.forward.args.to_dict().items() if "seed" in n]
    assert len(seeds) == 3


# the other ways in ---------------------------------------------------------------------------
def test_inference_model_outlined_equals_plain():
    model, (idx, targets) = gpt6()
    model.eval()
    plain = inference_model(copy.deepcopy(model), CPU)(idx, targets)
    run = inference_model(copy.deepcopy(model), CPU.replace(outline="auto"))
    outlined = run(idx, targets)
    for a, b in zip(plain, outlined):
        torch.testing.assert_close(a, b, **BITWISE)
    assert block_calls(run.ir)["DecoderBlock_subgraph(1)"] == 6


def test_compile_outlined_with_recompute_matches_eager_gradients():
    model, (idx, targets) = gpt6()
    eager = copy.deepcopy(model)
    compiled = compile(copy.deepcopy(model), CPU.replace(outline="auto", recompute=True))
    loss_e, _ = eager(idx, targets)
    loss_c, _ = compiled(idx, targets)
    loss_e.backward()
    loss_c.backward()
    torch.testing.assert_close(loss_c, loss_e, **BITWISE)
    for (n, p), q in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(q.grad, p.grad, **BITWISE, msg=n)


# bad input -------------------------------------------------------------------------------
def _build(model, inputs, outline, loss_fn=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = training_model(model, opt, loss_fn=loss_fn, options=CPU.replace(outline=outline))
    trainer(*inputs)


def test_outline_name_matching_no_module_lists_candidates():
    model, inputs = gpt6()
    with pytest.raises(OutlineError, match=r"'blocks\.9' matches no submodule") as e:
        _build(model, inputs, ["blocks.9"])
    assert "blocks.0..blocks.5 (DecoderBlock)" in str(e.value)


def test_outline_class_matching_no_module_raises():
    model, inputs = gpt6()
    with pytest.raises(OutlineError, match="'Conv3d' matches no submodule"):
        _build(model, inputs, [nn.Conv3d])


def test_outline_nested_modules_raise():
    model, inputs = gpt6()
    with pytest.raises(OutlineError, match=r"'blocks\.0\.mlp' is inside another outlined"):
        _build(model, inputs, ["blocks.0", "blocks.0.mlp"])


def test_outline_tied_weights_raise_for_a_list_and_inline_for_auto():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4)), nn.Sequential(nn.Linear(4, 4))
    )
    model[2][0].weight = model[1][0].weight
    x, y = torch.randn(2, 4), torch.randn(2, 4)
    with pytest.raises(OutlineError, match=r"'1' cannot be outlined: it shares '2\.0\.weight'"):
        _build(model, (x, y), ["1"], F.mse_loss)
    plain = train(model, (x, y), CPU, loss_fn=F.mse_loss, steps=2)
    auto = train(model, (x, y), CPU.replace(outline="auto"), loss_fn=F.mse_loss, steps=2)
    assert_same_training(plain, auto)
    assert not block_calls(auto[1].ir).keys() - {"Module_subgraph(0)", "Module_subgraph(0)_bwd"}


class Keyword(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.inner = nn.ModuleList([Scaled(), Scaled()])

    def forward(self, x):
        for block in self.inner:
            x = block(x, scale=x)
        return x


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, scale):
        return self.fc(x) * scale


def test_outline_keyword_call_raises_naming_the_fix():
    torch.manual_seed(0)
    x, y = torch.randn(2, 4), torch.randn(2, 4)
    with pytest.raises(OutlineError, match=r"'inner\.0' cannot be outlined: .*keyword.*scale"):
        _build(Keyword(), (x, y), ["inner.0"], F.mse_loss)


def test_outline_module_never_called_raises():
    torch.manual_seed(0)
    x, y = torch.randn(2, 4), torch.randn(2, 4)
    with pytest.raises(OutlineError, match=r"'blocks\.1' is never called by forward"):
        _build(Keyword(), (x, y), ["blocks.1"], F.mse_loss)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(recompute=True), ValueError, "set outline='auto'"),
        (dict(outline="yes"), ValueError, "give 'auto', False"),
        (dict(outline=[3]), TypeError, "neither a module name nor a class"),
    ],
)
def test_bad_option_values_raise_when_made(kwargs, error, match):
    with pytest.raises(error, match=match):
        Options(**kwargs)


# composition with the other pipeline stages ------------------------------------------------
def test_outline_recompute_with_accumulation_equals_accumulation_alone():
    model, inputs = gpt6()
    plain = train(model, inputs, CPU.replace(gradient_accumulation=2), steps=2)
    options = CPU.replace(gradient_accumulation=2, outline="auto", recompute=True)
    both = train(model, inputs, options, steps=2)
    assert_same_training(plain, both)
    assert block_calls(both[1].ir)["DecoderBlock_bwd_recomp_subgraph(2)"] == 6


def test_pipeline_records_the_outline_and_recompute_stages(gpt_runs):
    stages = {s.name: s for s in gpt_runs["recompute"][1]._active.stages}
    assert list(stages)[:4] == ["capture", "lower", "backward", "recompute"]
    assert stages["lower"].detail.startswith("outlined: blocks.*: one graph, 6 calls")
    assert "DecoderBlock_subgraph(1)" in stages["lower"].new_graphs
    assert "DecoderBlock_bwd_recomp_subgraph(2)" in stages["recompute"].new_graphs
    assert "Outlining: code" in stages["session"].detail
    plain = [s.name for s in gpt_runs["plain"][1]._active.stages]
    assert "recompute" not in plain


class Encoder(nn.Module):
    """torch.nn layers with their own lowering (leaves), called in a loop."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(
            [nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True) for _ in range(3)]
        )
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean(1))


def test_torch_nn_layers_with_a_lowering_outline_too():
    torch.manual_seed(0)
    model, x, y = Encoder(), torch.randn(2, 5, 16), torch.randint(0, 4, (2,))
    plain = train(model, (x, y), CPU, loss_fn=F.cross_entropy)
    options = CPU.replace(outline="auto", recompute=True)
    outlined = train(model, (x, y), options, loss_fn=F.cross_entropy)
    assert_same_training(plain, outlined)
    calls = block_calls(outlined[1].ir)
    assert calls["TransformerEncoderLayer_bwd_recomp_subgraph(2)"] == 3
    assert outlined[1].report().outlining().saved_bytes > 0


class Pair(nn.Module):
    """Calls its blocks with a keyword: cannot outline; its inner blocks can."""

    def __init__(self):
        super().__init__()
        self.a, self.b = Scaled(), Scaled()
        self.mlp = nn.Sequential(nn.Linear(4, 4), nn.Tanh())

    def forward(self, x, scale):
        return self.mlp(self.a(x, scale) + self.b(x, scale))


class Pairs(nn.Module):
    def __init__(self):
        super().__init__()
        self.pairs = nn.ModuleList([Pair(), Pair()])

    def forward(self, x):
        for pair in self.pairs:
            x = pair(x, scale=x)
        return x


def test_auto_outlines_inner_blocks_when_the_outer_ones_cannot():
    torch.manual_seed(0)
    model, x, y = Pairs(), torch.randn(2, 4), torch.randn(2, 4)
    plain = train(model, (x, y), CPU, loss_fn=F.mse_loss)
    auto = train(model, (x, y), CPU.replace(outline="auto"), loss_fn=F.mse_loss)
    # Scaled gets x twice (x and scale): the call's two input gradients add up in the
    # parent in another order than the inlined ops' -- float32 round-off of a re-ordered sum.
    # Measured: losses equal; 1 ulp on one weight (rel 8.8e-8); momentum abs 2.8e-9 (rel 5.8e-7)
    assert_same_training(plain, auto, dict(rtol=1e-6, atol=1e-8))
    calls = block_calls(auto[1].ir)
    # the pairs are called with scale=...: their Scaled blocks (4) and mlps (2) outline
    assert calls["Scaled_subgraph(1)"] == 4 and calls["Sequential_subgraph(2)"] == 2
    assert not any(name.startswith("Pair_") for name in calls)


class Twice(nn.Module):
    """One block called twice (shared weights by design) and a second, equal block."""

    def __init__(self):
        super().__init__()
        self.b1, self.b2 = Scaled(), Scaled()

    def forward(self, x):
        return self.b2(self.b1(self.b1(x, x), x), x)


def test_a_module_called_twice_binds_its_variables_at_both_calls():
    torch.manual_seed(0)
    model, x, y = Twice(), torch.randn(2, 4), torch.randn(2, 4)
    plain = train(model, (x, y), CPU, loss_fn=F.mse_loss)
    outlined = train(model, (x, y), CPU.replace(outline=["b1", "b2"]), loss_fn=F.mse_loss)
    # bitwise here (measured), though x is passed twice per call: the re-ordered sums of
    # test_auto_outlines_inner_blocks_when_the_outer_ones_cannot happen not to show
    assert_same_training(plain, outlined)
    assert block_calls(outlined[1].ir)["Scaled_subgraph(1)"] == 3
    names = outlined[1]._active.lowered.forward.args.to_dict()
    assert sorted(n for n in names if n.startswith("model.b")) == [
        "model.b1.fc.bias",
        "model.b1.fc.weight",
        "model.b2.fc.bias",
        "model.b2.fc.weight",
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, block, n", [("resnet18", "BasicBlock", 2), ("vit_b_16", "EncoderBlock", 12)]
)
def test_torchvision_outline_recompute_bitwise(name, block, n):
    """torchvision's own blocks: resnet18's two equal layer1 blocks, vit_b_16's 12 encoder
    blocks (measured: code 10.6 MiB against 59.1 MiB inlined)."""
    from tests.fx_zoo import TORCHVISION

    case = TORCHVISION[name]()
    inputs = (*case.inputs, case.targets)
    plain = train(case.model, inputs, CPU, loss_fn=case.loss_fn, steps=2)
    options = CPU.replace(outline="auto", recompute=True)
    outlined = train(case.model, inputs, options, loss_fn=case.loss_fn, steps=2)
    assert_same_training(plain, outlined)
    assert block_calls(outlined[1].ir)[f"{block}_bwd_recomp_subgraph(2)"] == n


def test_recompute_without_any_block_says_so(caplog):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
    x, y = torch.randn(2, 4), torch.randn(2, 2)
    plain = train(model, (x, y), CPU, loss_fn=F.mse_loss)
    with caplog.at_level("WARNING", logger="popxl_fx"):
        run = train(model, (x, y), CPU.replace(outline="auto", recompute=True), loss_fn=F.mse_loss)
    assert_same_training(plain, run)
    assert "found no repeated block, so nothing is recomputed" in caplog.text
    stages = {s.name: s.detail for s in run[1]._active.stages}
    assert stages["recompute"] == "no outlined block: nothing recomputed"


class ReturnsSize(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x), x.shape[0]


class SizeChain(nn.Module):
    def __init__(self):
        super().__init__()
        self.r = nn.ModuleList([ReturnsSize(), ReturnsSize()])

    def forward(self, x):
        for r in self.r:
            x, n = r(x)
        return x * n


def test_a_block_returning_a_python_value_inlines_or_raises():
    torch.manual_seed(0)
    model, x, y = SizeChain(), torch.randn(2, 4), torch.randn(2, 4)
    plain = train(model, (x, y), CPU, loss_fn=F.mse_loss, steps=1)
    auto = train(model, (x, y), CPU.replace(outline="auto"), loss_fn=F.mse_loss, steps=1)
    assert_same_training(plain, auto)
    assert not any("ReturnsSize" in name for name in block_calls(auto[1].ir))
    with pytest.raises(OutlineError, match=r"'r\.0' cannot be outlined: it returns something"):
        _build(model, (x, y), ["r.0"], F.mse_loss)
