"""popxl_fx.inference_model: eager numbers, one program per signature with a logged reason,
torch weight changes picked up, train-mode buffers written back, report/ir/schedule."""

import copy
import itertools
import logging

import pytest
import torch
from torch import nn

from popxl_fx.errors import UnsupportedError
from popxl_fx.inference import inference_model


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2)
        )
        self.fc = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        h = self.features(x)
        return {"logits": self.fc(h.flatten(1)), "pooled": h.mean((2, 3))}


def _model():
    torch.manual_seed(0)
    model = SmallCNN()
    with torch.no_grad():  # non-trivial running statistics for eval mode
        model.features[1].running_mean.uniform_(-0.5, 0.5)
        model.features[1].running_var.uniform_(0.5, 2.0)
    return model


def _close(ours, ref):
    # conv and matmul accumulate in a different order from torch's CPU kernels only where the
    # simulator's kernels differ; 1e-5 covers float32 rounding of sums over 27..128 terms.
    for key in ref:
        torch.testing.assert_close(ours[key], ref[key], rtol=1e-5, atol=1e-5, msg=key)


def test_eval_mode_matches_eager_and_keeps_the_output_structure():
    model = _model().eval()
    sim = inference_model(model)
    x = torch.randn(2, 3, 8, 8)
    out = sim(x)
    assert set(out) == {"logits", "pooled"}
    with torch.no_grad():
        _close(out, model(x))


def test_new_signature_recompiles_with_a_logged_reason_and_programs_are_cached(caplog):
    model = _model().eval()
    sim = inference_model(model)
    sim(torch.randn(2, 3, 8, 8))
    first = sim.ir
    with caplog.at_level(logging.INFO, logger="popxl_fx"):
        out = sim(torch.randn(4, 3, 8, 8))
    assert "recompiling" in caplog.text and "(4, 3, 8, 8)" in caplog.text
    assert out["logits"].shape == (4, 5) and sim.ir is not first
    sim(torch.randn(2, 3, 8, 8))
    assert sim.ir is first  # back to the first signature: the cached program, no rebuild


def test_train_mode_updates_torch_buffers_like_eager_and_mode_switch_recompiles(caplog):
    model = _model().train()
    eager = copy.deepcopy(model)
    sim = inference_model(model)
    x1, x2 = torch.randn(2, 3, 8, 8), torch.randn(2, 3, 8, 8)
    for x in (x1, x2):
        ours = sim(x)
        with torch.no_grad():
            _close(ours, eager(x))
    for name, buf in eager.named_buffers():
        torch.testing.assert_close(dict(model.named_buffers())[name], buf, rtol=1e-6, atol=1e-6)
    model.eval()
    eager.eval()
    with caplog.at_level(logging.INFO, logger="popxl_fx"):
        ours = sim(x1)
    assert "train/eval mode" in caplog.text
    with torch.no_grad():
        _close(ours, eager(x1))


def test_torch_weight_changes_reach_the_simulator():
    model = _model().eval()
    sim = inference_model(model)
    x = torch.randn(2, 3, 8, 8)
    sim(x)
    with torch.no_grad():
        model.fc.weight.mul_(-2.0)
        model.fc.bias.fill_(0.25)
    with torch.no_grad():
        _close(sim(x), model(x))


def test_report_ir_and_schedule():
    model = _model().eval()
    sim = inference_model(model)
    with pytest.raises(RuntimeError, match="called yet"):
        sim.report()
    sim(torch.randn(2, 3, 8, 8))
    names = {t.name for t in sim.ir.main_graph.variables}
    assert names == {n for n in model.state_dict() if not n.endswith("num_batches_tracked")}
    schedule = sim.print_schedule()
    assert "main:" in schedule and "forward:" in schedule and "Conv" in schedule
    assert sim.report() is not None and "IPU" in sim.report().summary()


class Bad(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        if y.sum() > 0:
            return torch.fft.rfft(y).abs()
        return y


def test_unsupported_model_raises_every_issue_before_building_and_is_left_unchanged():
    model = Bad()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(UnsupportedError) as info:
        inference_model(model)(torch.ones(2, 4))
    kinds = [i.kind for i in info.value.issues]
    assert kinds == ["data-dependent control flow", "unsupported op"]
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])


_CALLS = itertools.count(1)  # state outside the module (inside it is refused at capture)


class Growing(nn.Module):
    """Its output shape grows with every call: a program built once would freeze it."""

    def forward(self, x):
        return x[:, : next(_CALLS)] + 1.0


def test_shape_that_changes_between_calls_is_refused_at_build_time():
    with pytest.raises(UnsupportedError, match="shape changes between calls"):
        inference_model(Growing())(torch.ones(2, 4))


def test_options_pick_the_device_and_bad_inputs_fail_like_eager_naming_the_line():
    from popxl_fx.options import Options

    model = nn.Sequential(nn.Linear(4, 2))
    sim = inference_model(model, Options(device="cpu"))
    torch.testing.assert_close(sim(torch.ones(3, 4)), model(torch.ones(3, 4)), rtol=0, atol=0)
    assert sim.session.device_desc == "cpu"
    with pytest.raises(RuntimeError, match="cannot be multiplied") as info:
        sim(torch.ones(3, 5))  # the wrong width: torch's own error, located
    assert "Linear module '0'" in info.value.__notes__[0]
