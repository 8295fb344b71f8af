"""How popxl_fx calls a model's forward and what it gives back (popxl_fx.calls,
popxl_fx.capture_calls): keyword tensors and constants, parameters left at their defaults,
``**kwargs`` and ``*args`` forwards, modules made during forward, item assignment into a
fresh tensor, an in-place update viewed afterwards, outputs in forward's structure, and
non-tensor outputs named. Every number is compared with eager PyTorch bit for bit
(torch.equal: the same torch kernels run)."""

from __future__ import annotations

import copy
from collections import namedtuple
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import popxl_fx
from popxl_fx.errors import UnsupportedError


class KwargsNet(nn.Module):
    """A HuggingFace-style forward: optional tensors, plain options and ``**kwargs``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 3)

    def forward(self, x, mask=None, scale=1.0, labels=None, **kwargs):
        y = self.fc(x) * scale
        if mask is not None:
            y = y.masked_fill(mask, 0.0)
        if labels is None:
            return {"logits": y}
        return {"loss": F.cross_entropy(y, labels), "logits": y}


def _x() -> torch.Tensor:
    return torch.randn(5, 4, generator=torch.Generator().manual_seed(1))


def test_unused_optional_arguments_and_kwargs_keep_their_defaults():
    net, x = KwargsNet().eval(), _x()
    mask = x[:, :3] > 0
    sim = popxl_fx.inference_model(net)
    assert torch.equal(sim(x)["logits"], net(x)["logits"])
    assert torch.equal(sim(x, mask=mask)["logits"], net(x, mask=mask)["logits"])
    # a plain keyword value is a constant of the program: another value, another program
    assert torch.equal(sim(x, scale=2.0)["logits"], net(x, scale=2.0)["logits"])
    assert popxl_fx.check(net, x).ok
    assert popxl_fx.check(net, x, mask=mask, scale=0.5).ok


def test_keyword_labels_reach_the_models_own_loss():
    torch.manual_seed(0)
    net, x, y = KwargsNet(), _x(), torch.tensor([0, 2, 1, 1, 0])
    eager = copy.deepcopy(net)
    trainer = popxl_fx.training_model(net, torch.optim.AdamW(net.parameters(), lr=0.1))
    opt = torch.optim.AdamW(eager.parameters(), lr=0.1)
    for _ in range(2):
        loss = trainer(x, labels=y, scale=2.0)
        opt.zero_grad()
        ref = eager(x, labels=y, scale=2.0)["loss"]
        ref.backward()
        opt.step()
        assert torch.equal(loss, ref.detach())
    for p, q in zip(net.parameters(), eager.parameters()):
        assert torch.equal(p, q)


def test_loss_fn_with_keyword_inputs_to_the_model():
    torch.manual_seed(0)
    net, x, y = KwargsNet(), _x(), torch.tensor([0, 2, 1, 1, 0])
    mask = x[:, :3] > 0.5
    eager = copy.deepcopy(net)

    def loss_fn(out, target):
        return F.cross_entropy(out["logits"], target)

    trainer = popxl_fx.training_model(net, torch.optim.SGD(net.parameters(), lr=0.1), loss_fn)
    opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    loss = trainer(x, y, mask=mask)
    ref = loss_fn(eager(x, mask=mask), y)
    ref.backward()
    opt.step()
    assert torch.equal(loss, ref.detach())
    assert torch.equal(net.fc.weight, eager.fc.weight)


def test_keyword_argument_that_is_neither_tensor_nor_plain_value_is_refused():
    with pytest.raises(TypeError, match="keyword argument mask=object"):
        popxl_fx.inference_model(KwargsNet())(_x(), mask=object())


class StarArgs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 2)

    def forward(self, *xs):
        return sum(self.fc(x) for x in xs)


def test_star_args_forward_gets_each_tensor_whole():
    net = StarArgs().eval()
    a, b = _x(), _x() * 2
    assert torch.equal(popxl_fx.inference_model(net)(a, b), net(a, b))
    assert popxl_fx.check(net, a, b).ok


_GELU = nn.GELU()  # a module-level activation instance, not a submodule of any model


class MadeInForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 3)

    def forward(self, x, labels):
        h = _GELU(nn.ReLU()(self.fc(x)) - 0.1)
        return nn.CrossEntropyLoss()(h, labels), h


def test_modules_made_during_forward_are_traced_through():
    torch.manual_seed(0)
    net, x, y = MadeInForward(), _x(), torch.tensor([0, 2, 1, 1, 0])
    eager = copy.deepcopy(net)
    assert popxl_fx.check(net, x, y).ok
    trainer = popxl_fx.training_model(net, torch.optim.AdamW(net.parameters(), lr=0.1))
    opt = torch.optim.AdamW(eager.parameters(), lr=0.1)
    for _ in range(2):
        loss = trainer(x, y)
        opt.zero_grad()
        ref = eager(x, y)[0]
        ref.backward()
        opt.step()
        assert torch.equal(loss, ref.detach())
    assert torch.equal(net.fc.weight, eager.fc.weight)


class LinearMadeInForward(nn.Module):
    def forward(self, x):
        return nn.Linear(4, 2)(x)


def test_module_with_parameters_made_during_forward_is_reported():
    issues = popxl_fx.check(LinearMadeInForward(), _x()).issues
    assert issues[0].kind == "module made during forward"
    assert "Linear" in issues[0].what and "__init__" in issues[0].hint


class ShiftLabels(nn.Module):
    """T5's ``_shift_right``: item assignment into a tensor made in forward."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(6, 4)
        self.fc = nn.Linear(4, 6)

    def forward(self, labels):
        shifted = labels.new_zeros(labels.shape)
        shifted[..., 1:] = labels[..., :-1].clone()
        shifted[..., 0] = 5
        shifted.masked_fill_(shifted == -100, 0)
        logits = self.fc(self.emb(shifted))
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)


def test_item_assignment_into_a_fresh_tensor():
    torch.manual_seed(0)
    net, y = ShiftLabels(), torch.tensor([[1, 2, -100, 4], [3, 3, 1, 0]])
    eager = copy.deepcopy(net)
    assert popxl_fx.check(net, y).ok
    trainer = popxl_fx.training_model(net, torch.optim.SGD(net.parameters(), lr=0.5))
    opt = torch.optim.SGD(eager.parameters(), lr=0.5)
    for _ in range(2):
        loss = trainer(y)
        opt.zero_grad()
        ref = eager(y)
        ref.backward()
        opt.step()
        assert torch.equal(loss, ref.detach())
    assert torch.equal(net.emb.weight, eager.emb.weight)


class AssignIntoView(nn.Module):
    def forward(self, x):
        y = x * 2
        v = y[0]
        y[1:] = 0.0
        return v + y.sum()


class AssignIntoInput(nn.Module):
    def forward(self, x):
        x[0] = 1.0
        return x * 2


def test_item_assignment_seen_through_a_view_taken_before_like_eager():
    x = _x()
    assert torch.equal(popxl_fx.inference_model(AssignIntoView())(x), AssignIntoView()(x))


def test_item_assignment_into_an_input_is_written_back_like_eager():
    x, expected = _x(), _x()
    out = popxl_fx.inference_model(AssignIntoInput())(x)
    assert torch.equal(out, AssignIntoInput()(expected)) and torch.equal(x, expected)


class UpdateThenView(nn.Module):
    def forward(self, x):
        y = torch.cat([x, -x], dim=1)
        y.masked_fill_(y > 0.5, 0.0)
        return y.view(-1) * 3


def test_inplace_update_viewed_only_afterwards_is_not_refused():
    net, x = UpdateThenView(), _x()
    assert popxl_fx.check(net, x).ok
    assert torch.equal(popxl_fx.inference_model(net)(x), net(x))


@dataclass
class Out:
    loss: torch.Tensor
    logits: torch.Tensor
    extra: torch.Tensor | None = None


Pair = namedtuple("Pair", ["loss", "logits"])


class Structured(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 3)
        self.kind = kind

    def forward(self, x, labels):
        logits = self.fc(x)
        loss = F.cross_entropy(logits, labels)
        if self.kind == "dataclass":
            return Out(loss=loss, logits=logits)
        if self.kind == "namedtuple":
            return Pair(loss, logits)
        return {"logits": logits, "nested": [logits * 2, (loss,)], "loss": loss}


@pytest.mark.parametrize("kind", ["dataclass", "namedtuple", "dict"])
def test_outputs_keep_the_structure_forward_returns(kind):
    net, x, y = Structured(kind).eval(), _x(), torch.tensor([0, 2, 1, 1, 0])
    out, ref = popxl_fx.inference_model(net)(x, y), net(x, y)
    assert type(out) is type(ref)
    leaves, spec = torch.utils._pytree.tree_flatten(out)
    ref_leaves, ref_spec = torch.utils._pytree.tree_flatten(ref)
    assert spec == ref_spec
    assert all(torch.equal(a, b) for a, b in zip(leaves, ref_leaves))
    # the trainer finds the loss by name (out.loss / out["loss"]), not only in first place
    copied = copy.deepcopy(net)
    trainer = popxl_fx.training_model(copied, torch.optim.SGD(copied.parameters(), 0.1))
    assert torch.equal(trainer(x, y), ref.loss if kind != "dict" else ref["loss"])


class Cache:
    """A stand-in for a KV cache object."""


class ReturnsCache(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return {"logits": self.fc(x), "past_key_values": Cache()}


def test_non_tensor_output_is_named_with_the_fix():
    issues = popxl_fx.check(ReturnsCache(), _x()).issues
    assert [i.kind for i in issues] == ["non-tensor output"]
    assert "Cache at ['past_key_values']" in issues[0].what
    assert "use_cache=False" in issues[0].hint
    with pytest.raises(UnsupportedError, match="non-tensor output"):
        popxl_fx.inference_model(ReturnsCache())(_x())
