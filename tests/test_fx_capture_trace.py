"""Capture: module hierarchy, leaves, shape propagation, source lines, shape folding,
variables named by torch names (tied weights shared), pytree outputs."""

import operator

import torch
from torch import nn

from popxl_fx.capture import capture, is_leaf

from .fx_capture_util import eager_grads, run_module


def _line(text: str) -> str:
    with open(__file__) as f:
        lines = [i for i, line in enumerate(f, 1) if text in line and "_line(" not in line]
    assert len(lines) == 1, (text, lines)
    return f"{__file__}:{lines[0]}"


class Block(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(n, n)
        self.scale = nn.Parameter(torch.full((n,), 0.5))

    def forward(self, x):
        return self.fc(x) * self.scale + x  # block-line


class Net(nn.Module):
    def __init__(self, n=6):
        super().__init__()
        self.blocks = nn.ModuleList([Block(n), Block(n)])
        self.head = nn.Sequential(nn.Linear(n, 3), nn.Tanh())

    def forward(self, x):
        b, t = x.shape[:2]
        h = x.reshape(x.size(0) * t, -1)
        for block in self.blocks:
            h = block(h)
        h = h.view(b, t, x.shape[-1]) * (1.0 / x.dim()) + len(x)
        return self.head(h.flatten(0, 1)).view(b, x.size(1), -1)


def test_hierarchy_leaves_paths_and_source_lines():
    model, x = Net(), torch.randn(2, 4, 6)
    gm = capture(model, [x]).gm
    leaves = [n.target for n in gm.graph.nodes if n.op == "call_module"]
    assert leaves == ["blocks.0.fc", "blocks.1.fc", "head.0", "head.1"]
    assert is_leaf(model.head[0]) and not is_leaf(model.blocks[0]) and not is_leaf(model.head)
    muls = [n for n in gm.graph.nodes if n.target is operator.mul and "scale" in str(n.args)]
    assert [n.meta["module_path"] for n in muls] == ["blocks.0", "blocks.1"]
    assert all(n.meta["source"] == _line("# block-line") for n in muls)
    assert all(n.stack_trace and "block-line" in n.stack_trace for n in muls)
    params = [n.target for n in gm.graph.nodes if n.op == "get_attr"]
    assert params == ["blocks.0.scale", "blocks.1.scale"]


def test_shape_queries_fold_to_constants_and_every_node_has_its_value():
    model, x = Net(), torch.randn(2, 4, 6)
    gm = capture(model, [x]).gm
    calls = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
    # x.shape, x.size(), x.dim(), len(x) and the arithmetic on them left no node behind
    assert not [n for n in calls if n.target in ("size", "dim", getattr, len)]
    views = [n for n in calls if n.target in ("view", "reshape")]
    assert [n.args[1:] for n in views] == [(8, -1), (2, 4, 6), (2, 4, -1)]
    for node in gm.graph.nodes:
        if node.op not in ("output",):
            assert isinstance(node.meta["example_value"], torch.Tensor), node
    out = list(gm.graph.nodes)[-2].meta["example_value"]
    torch.testing.assert_close(out, model(x), rtol=0, atol=0)


def test_net_lowers_and_matches_eager_forward_and_gradients():
    torch.manual_seed(0)
    model, x = Net(), torch.randn(2, 4, 6)
    dy = torch.randn(2, 4, 3)
    ours, ref = run_module(model, x, dy=dy), eager_grads(model, [x], dy)
    torch.testing.assert_close(ours["out"][0], ref["out"], rtol=1e-6, atol=1e-6)
    assert set(ours["grads"]) == set(ref["grads"])  # x0 + every parameter, by torch name
    for name, grad in ref["grads"].items():
        torch.testing.assert_close(ours["grads"][name], grad, rtol=1e-5, atol=1e-6, msg=name)


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Linear(4, 4, bias=False)
        self.out = nn.Linear(4, 4, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, x):
        return {"logits": self.out(torch.relu(self.emb(x))), "skip": (x * 2.0,)}


def test_tied_weights_share_one_variable_and_dict_outputs_keep_their_structure():
    torch.manual_seed(0)
    model, x = Tied(), torch.randn(3, 4)
    ours = run_module(model, x)
    assert set(ours["variables"]) == {"emb.weight"}
    logits, skip = ours["out"]
    ref = model(x)
    torch.testing.assert_close(logits, ref["logits"], rtol=0, atol=0)
    torch.testing.assert_close(skip, ref["skip"][0], rtol=0, atol=0)


class Pair(nn.Module):
    """Stands for a standard torch.nn module with children and no lowering."""

    __module__ = "torch.nn.modules.fake"

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.LayerNorm(8)

    def forward(self, x):
        return self.b(self.a(x))


class WithPair(nn.Module):
    def __init__(self):
        super().__init__()
        self.pair = Pair()

    def forward(self, x):
        return self.pair(x)


def test_standard_module_without_lowering_but_with_children_is_traced_through():
    model = WithPair()
    assert not is_leaf(model.pair) and is_leaf(model.pair.a)
    gm = capture(model, [torch.randn(2, 3, 8)]).gm
    assert [n.target for n in gm.graph.nodes if n.op == "call_module"] == ["pair.a", "pair.b"]


def test_user_frames_skip_torch_popxl_fx_and_stdlib_but_not_installed_packages():
    import os
    import traceback

    import torchvision

    from popxl_fx.errors import user_frame

    def frame(path):
        return traceback.FrameSummary(path, 7, "f", lookup_line=False)

    vision = os.path.join(os.path.dirname(torchvision.__file__), "models", "resnet.py")
    inner = [
        frame(os.path.join(os.path.dirname(torch.__file__), "nn", "modules", "linear.py")),
        frame(os.path.join(os.path.dirname(os.__file__), "contextlib.py")),
    ]
    assert user_frame([frame(__file__), frame(vision), *inner]) == f"{vision}:7"
    assert user_frame([frame(__file__), *inner]) == f"{__file__}:7"
    assert user_frame(inner) == "<unknown>"


class Positional(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("offset", torch.linspace(-1.0, 1.0, 5))
        self.table = torch.arange(5.0) / 10  # a plain tensor attribute: a constant

    def forward(self, x):
        steps = torch.arange(x.shape[1], dtype=x.dtype)  # built from a folded shape
        return x * self.table + self.offset - steps


def test_buffers_are_variables_plain_tensors_are_constants_and_the_model_is_untouched():
    model, x = Positional(), torch.randn(3, 5)
    attrs = set(vars(model))
    ours = run_module(model, x)
    assert set(vars(model)) == attrs  # fx's _tensor_constant attributes stay off the model
    assert set(ours["variables"]) == {"offset"}
    torch.testing.assert_close(ours["out"][0], model(x), rtol=0, atol=0)


class _DuckTyped(nn.Module):
    """Probes its input the way transformers' ``is_tracing`` does (``hasattr(x, "jax")``)."""

    def forward(self, x):
        if hasattr(x, "jax"):  # a tensor has no .jax in eager: never taken
            x = x.jax()
        scale = getattr(x, "not_a_tensor_attribute", 2.0)
        return x * scale


def test_attribute_probes_on_a_tensor_answer_as_in_eager():
    """A proxy answered any attribute with a lazy proxy, so ``hasattr`` said yes and the trace
    called ``x.jax()`` (an unsupported-op error for GPT-2 when jax was installed)."""
    x = torch.randn(3, 4)
    captured = capture(_DuckTyped(), (x,))
    assert not captured.issues
    assert [n.target for n in captured.gm.graph.nodes if n.op == "call_method"] == []
    assert torch.equal(run_module(_DuckTyped(), x)["out"][0], x * 2.0)
