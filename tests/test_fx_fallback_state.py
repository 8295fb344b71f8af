"""Hidden state in what popxl_fx lowers: random ATen ops of the decomposition fallback draw from
the simulator's seeded stream (not torch's: their values are checked by their distribution and
by the forward/backward mask agreeing, exactly), random ops without a lowering and in-place
updates the program cannot carry are reported by `check` with the op, fx node, module path and
source line; in-place updates of buffers (traced, or inside a function) update the buffer like
eager (exact)."""

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn

from popxl_fx.check import check

from .fx_capture_util import run_module


def _line(text: str) -> str:
    with open(__file__) as f:
        lines = [i for i, line in enumerate(f, 1) if text in line and "_line(" not in line]
    assert len(lines) == 1, (text, lines)
    return f"{__file__}:{lines[0]}"


def noisy(x):  # not in the table: decomposes to empty_permuted, bernoulli.p, div, mul
    return F.dropout(x, 0.3, True)


def uniform_noise(x):
    return x + torch.rand_like(x)


def coin(p):
    return torch.bernoulli(p.clamp(0.0, 1.0))


def depth(x):
    return torchvision.ops.stochastic_depth(x, 0.5, "row", True)


torch.fx.wrap("noisy")
torch.fx.wrap("uniform_noise")
torch.fx.wrap("coin")


class Noisy(nn.Module):
    def forward(self, x):
        return noisy(x)


class UniformNoise(nn.Module):
    def forward(self, x):
        return uniform_noise(x)


class NormalNoise(nn.Module):
    def forward(self, x):
        # only Python arguments: torch.fx alone would freeze one draw into the graph
        return x + torch.randn(x.shape)


class Coin(nn.Module):
    def forward(self, p):
        return coin(p)


class Depth(nn.Module):
    def forward(self, x):
        return depth(x)


def test_dropout_in_a_function_draws_from_the_seeded_stream():
    torch.manual_seed(0)
    x = torch.rand(50, 80) + 1.0  # no zeros of its own
    dy = torch.randn(50, 80)
    got = run_module(Noisy(), x, dy=dy)
    out, grad = got["out"][0], got["grads"]["x0"]
    kept = out != 0
    assert 0.25 < 1 - kept.float().mean().item() < 0.35  # p = 0.3 of 4000 draws
    scale = kept.float() / 0.7  # torch's decomposition: x * (mask / (1 - p))
    torch.testing.assert_close(out, x * scale, rtol=0, atol=0)
    torch.testing.assert_close(grad, dy * scale, rtol=0, atol=0)  # the forward's mask


def test_stochastic_depth_in_training_drops_whole_rows():
    torch.manual_seed(0)
    x = torch.rand(400, 3) + 1.0
    out = run_module(Depth(), x)["out"][0]
    dropped = (out == 0).all(1)
    assert 0.4 < dropped.float().mean().item() < 0.6
    torch.testing.assert_close(out[~dropped], x[~dropped] / 0.5, rtol=0, atol=0)


def test_rand_like_has_torchs_distribution():
    u = run_module(UniformNoise(), torch.zeros(100, 100))["out"][0]
    assert 0.0 <= u.min().item() and u.max().item() < 1.0
    assert abs(u.mean().item() - 0.5) < 0.02


def test_randn_with_python_arguments_is_drawn_every_run_not_frozen():
    from popxl_fx.capture import capture

    gm = capture(NormalNoise(), (torch.zeros(2, 2),)).gm
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"][0] is torch.randn
    n = run_module(NormalNoise(), torch.zeros(100, 100))["out"][0]
    assert abs(n.mean().item()) < 0.03 and abs(n.std().item() - 1.0) < 0.03


def test_bernoulli_of_a_probability_tensor():
    p = torch.tensor([[0.0, 1.0, 1.0, 0.0]] * 3)
    torch.testing.assert_close(run_module(Coin(), p)["out"][0], p, rtol=0, atol=0)


def with_randint(x):
    return x + torch.randint(0, 5, x.shape)  # randint-line


def with_multinomial(x):
    return torch.multinomial(torch.softmax(x, -1), 2)  # multinomial-line


def with_randperm(x):
    return x[torch.randperm(x.shape[0])]  # randperm-line


def with_exponential(x):
    return x + torch.empty_like(x).exponential_()  # exponential-line


UNSUPPORTED_RANDOM = {  # function: (its torch call, the ATen op it needs)
    "randint": (with_randint, "torch.randint", "aten.randint"),
    "multinomial": (with_multinomial, "torch.multinomial", "aten.multinomial"),
    "randperm": (with_randperm, "torch.randperm", "aten.randperm"),
    "exponential": (with_exponential, "Tensor.exponential_", "aten.exponential"),
}


class RandomInside(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


@pytest.mark.parametrize("name", sorted(UNSUPPORTED_RANDOM))
def test_random_ops_the_ipu_stream_lacks_draw_from_torchs_generator(name):
    """randint, multinomial, randperm and exponential have no seeded-stream form: with the
    default Options(rng="torch") they are torch's kernels, drawing what eager draws."""
    from popxl_fx import Options
    from popxl_fx.inference import inference_model

    fn, _, _ = UNSUPPORTED_RANDOM[name]
    model, x = nn.Sequential(RandomInside(fn)), torch.randn(4, 6)
    sim = inference_model(model, Options(device="cpu"))
    for seed in (1, 2):
        torch.manual_seed(seed)
        want = model(x)
        torch.manual_seed(seed)
        assert torch.equal(sim(x), want), name


# buffers and other state updated in place ----------------------------------------------------
def count_calls(x, counter):
    counter.add_(1)
    return x * 2.0


def scale_input_(x, y):
    x.mul_(2.0)
    return x + y


torch.fx.wrap("count_calls")
torch.fx.wrap("scale_input_")


class FunctionCounter(nn.Module):
    """A buffer passed to a function that updates it in place (like running statistics)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(2))

    def forward(self, x):
        return count_calls(x, self.calls)


class TracedCounter(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, x):
        self.calls.add_(1.0)
        return x + self.calls


@pytest.mark.parametrize("cls", [FunctionCounter, TracedCounter])
def test_buffers_updated_in_place_keep_their_new_value(cls):
    x = torch.randn(2, 1)
    got = run_module(cls(), x)
    eager = cls()
    want = eager(x)
    torch.testing.assert_close(got["out"][0], want, rtol=0, atol=0)
    torch.testing.assert_close(got["variables"]["calls"], eager.calls, rtol=0, atol=0)


class MutatesInput(nn.Module):
    def forward(self, x, y):
        return scale_input_(x, y)  # input-line


def test_in_place_update_of_a_model_input_in_a_function_is_reported():
    (issue,) = check(MutatesInput(), torch.randn(3), torch.randn(3)).issues
    assert issue.kind == "hidden state" and issue.node == "scale_input_"
    assert "the model input 'x'" in issue.hint
    assert issue.source == _line("# input-line")


class PlainState(nn.Module):
    """A tensor held as a plain attribute, updated in place: eager keeps counting."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.steps = torch.zeros(1)

    def forward(self, x):
        self.steps.add_(1.0)
        return self.fc(x) + self.steps  # plain-read-line


def test_in_place_update_of_a_plain_attribute_is_reported_and_left_as_it_was():
    model = PlainState()
    (issue,) = check(model, torch.randn(2, 3)).issues
    assert issue.kind == "hidden state" and issue.source == _line("# plain-read-line")
    assert "plain tensor attribute 'steps'" in issue.what and "register_buffer" in issue.hint
    assert model.steps.item() == 0.0  # check ran the forward twice and put it back


class TorchLikeLeaf(nn.Module):
    """Stands for a standard torch.nn module without a lowering (a leaf the fallback
    decomposes) that keeps a plain tensor attribute it updates in place."""

    __module__ = "torch.nn.modules.test_only"

    def __init__(self):
        super().__init__()
        self.seen = torch.zeros(1)

    def forward(self, x):
        self.seen.add_(1.0)
        return x * self.seen


class HasLeaf(nn.Module):
    def __init__(self):
        super().__init__()
        self.leaf = TorchLikeLeaf()

    def forward(self, x):
        return self.leaf(x)  # leaf-line


def test_a_leaf_updating_a_plain_attribute_is_reported_and_left_as_it_was():
    model = HasLeaf()
    # (the decomposition then also lacks aten.add_ on the constant: a second issue)
    (issue,) = [i for i in check(model, torch.randn(2, 3)).issues if i.kind == "hidden state"]
    assert issue.kind == "hidden state" and issue.module_path == "leaf"
    assert issue.source == _line("# leaf-line") and "'leaf.seen'" in issue.what
    assert model.leaf.seen.item() == 0.0
