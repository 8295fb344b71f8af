"""popxl_fx.training_model and popxl_fx.compile on a small MLP, against eager PyTorch.

Tolerances: float32, rtol 1e-5 / atol 1e-6 for losses, outputs, gradients, parameters and
optimizer state after 3 steps (the simulator's matmuls and reductions may round differently from
torch's in the last bits; the optimizers themselves are bit-exact or within 1e-6, see
test_fx_train_optim.py).
"""

import copy
import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import popxl_fx
from popxl_core.sim.plan import OutOfMemoryError
from popxl_fx.api import Options, compile, training_model
from popxl_fx.errors import UnsupportedError
from popxl_fx.optim import UnsupportedOptimizerError
from popxl_fx.testing import assert_matches_eager

RTOL, ATOL = 1e-5, 1e-6
CPU = Options(device="cpu")
OPTIMIZERS = {
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-4),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=1e-2),
}


def mse(out, target):
    return ((out - target) ** 2).mean()


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))


def data(batch=5, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 8, generator=g), torch.randn(batch, 4, generator=g)


@pytest.mark.parametrize("via", ["training_model", "compile"])
@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
def test_mlp_matches_eager(via, opt):
    x, y = data()
    assert_matches_eager(
        mlp(),
        x,
        targets=y,
        loss_fn=mse,
        optimizer=OPTIMIZERS[opt],
        steps=3,
        rtol=RTOL,
        atol=ATOL,
        via=via,
        options=CPU,
    )


class LossModel(nn.Module):
    """A model whose forward returns (loss, logits)."""

    def __init__(self):
        super().__init__()
        self.net = mlp()

    def forward(self, x, y):
        out = self.net(x)
        return mse(out, y), out


def test_loss_from_forward():
    x, y = data()
    assert_matches_eager(
        LossModel(), (x, y), optimizer=OPTIMIZERS["adamw"], rtol=RTOL, atol=ATOL, options=CPU
    )


def _eager_steps(model, opt, batches):
    for x, y in batches:
        loss = mse(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_state_dicts_are_torch_own_and_checkpoints_move_both_ways():
    model, twin = mlp(), mlp()
    opt, twin_opt = (
        OPTIMIZERS["sgd_momentum"](model.parameters()),
        OPTIMIZERS["sgd_momentum"](twin.parameters()),
    )
    trainer = training_model(model, opt, mse, CPU)
    batches = [data(seed=s) for s in range(4)]
    for x, y in batches[:2]:
        trainer(x, y)
    _eager_steps(twin, twin_opt, batches[:2])
    # reading state_dict copies the simulated weights and optimizer state back
    for name, value in twin.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value, rtol=RTOL, atol=ATOL)
    sd = opt.state_dict()
    assert set(sd["state"][0]) == {"momentum_buffer"}
    # eager continues from the simulated checkpoint, the simulator from eager's
    eager2, sim2 = mlp(), mlp()
    eager2.load_state_dict(model.state_dict())
    eager2_opt = OPTIMIZERS["sgd_momentum"](eager2.parameters())
    eager2_opt.load_state_dict(opt.state_dict())
    sim2.load_state_dict(twin.state_dict())
    sim2_opt = OPTIMIZERS["sgd_momentum"](sim2.parameters())
    sim2_opt.load_state_dict(twin_opt.state_dict())
    trainer2 = training_model(sim2, sim2_opt, mse, CPU)
    for x, y in batches[2:]:
        trainer2(x, y)
    _eager_steps(eager2, eager2_opt, batches[2:])
    for name, value in eager2.state_dict().items():
        torch.testing.assert_close(trainer2.model.state_dict()[name], value, rtol=RTOL, atol=ATOL)


def test_lr_scheduler_changes_lr_without_recompiling():
    model, twin = mlp(), mlp()
    opt, twin_opt = (OPTIMIZERS["adamw"](m.parameters()) for m in (model, twin))
    scheds = [torch.optim.lr_scheduler.StepLR(o, 1, gamma=0.1) for o in (opt, twin_opt)]
    trainer = training_model(model, opt, mse, CPU)
    batches = [data(seed=s) for s in range(3)]
    for x, y in batches:
        trainer(x, y)
        scheds[0].step()
    for x, y in batches:
        _eager_steps(twin, twin_opt, [(x, y)])
        scheds[1].step()
    assert len(trainer._programs) == 1
    for name, value in twin.state_dict().items():
        torch.testing.assert_close(trainer.model.state_dict()[name], value, rtol=RTOL, atol=ATOL)


def test_shape_and_mode_changes_recompile_with_a_logged_reason(caplog):
    model, twin = mlp(), mlp()
    opt, twin_opt = (OPTIMIZERS["sgd_momentum"](m.parameters()) for m in (model, twin))
    trainer = training_model(model, opt, mse, CPU)
    batches = [data(5, 0), data(3, 1), data(5, 2)]
    with caplog.at_level(logging.INFO, logger="popxl_fx"):
        for x, y in batches:
            trainer(x, y)
    assert "recompiling, the inputs changed from (((5, 8)" in caplog.text
    assert len(trainer._programs) == 2  # the first program is reused for the third batch
    _eager_steps(twin, twin_opt, batches)
    for name, value in twin.state_dict().items():
        torch.testing.assert_close(trainer.model.state_dict()[name], value, rtol=RTOL, atol=ATOL)
    model.eval()
    with caplog.at_level(logging.INFO, logger="popxl_fx"):
        trainer(*data(5, 0))
    assert "train/eval mode changed" in caplog.text


def test_compile_decorator_grad_clipping_and_eval():
    @compile
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = mlp()

        def forward(self, x):
            return self.net(x)

    model = Net()
    twin = copy.deepcopy(model)
    opts = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (model, twin)]
    for step in range(2):
        x, y = data(seed=step)
        for m, o in zip((model, twin), opts):
            o.zero_grad()
            mse(m(x), y).backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 0.05)
            o.step()
    for name, value in twin.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value, rtol=RTOL, atol=ATOL)
    model.eval()
    twin.eval()
    with torch.no_grad():
        x, _ = data()
        torch.testing.assert_close(model(x), twin(x), rtol=RTOL, atol=ATOL)


# bad input ------------------------------------------------------------------------------
def test_no_loss_and_no_loss_fn():
    model = mlp()
    trainer = training_model(model, OPTIMIZERS["adamw"](model.parameters()), options=CPU)
    with pytest.raises(ValueError, match=r"scalar float loss.*shape \(5, 4\).*loss_fn="):
        trainer(data()[0])


def test_integer_inputs_to_a_float_model():
    model = mlp()
    trainer = training_model(model, OPTIMIZERS["adamw"](model.parameters()), mse, CPU)
    with pytest.raises(TypeError, match=r"input 0 of Sequential has dtype torch.int64.*float32"):
        trainer(torch.ones(5, 8, dtype=torch.int64), data()[1])


def test_wrong_target_shape():
    model = mlp()
    trainer = training_model(model, OPTIMIZERS["adamw"](model.parameters()), nn.MSELoss(), CPU)
    with pytest.raises(
        ValueError,
        match=r"target has shape \(5, 3\).*needs a target of shape "
        r"\(5, 4\)",
    ):
        trainer(data()[0], torch.zeros(5, 3))


def test_wrong_class_target_shape_and_a_loss_that_cannot_take_the_target():
    # checked while the loss wrapper is traced, from the model output's example value
    model = mlp()
    trainer = training_model(model, OPTIMIZERS["adamw"](model.parameters()), F.cross_entropy, CPU)
    with pytest.raises(ValueError, match=r"target has shape \(5, 2\).*target of shape \(5,\)"):
        trainer(data()[0], torch.zeros(5, 2, dtype=torch.int64))

    def dot_loss(out, target):
        return (out @ target).sum()

    trainer = training_model(model, OPTIMIZERS["adamw"](model.parameters()), dot_loss, CPU)
    with pytest.raises(ValueError, match=r"dot_loss cannot take the model's output \(shape"):
        trainer(data()[0], torch.zeros(5, 3))


@pytest.mark.parametrize(
    "make",
    [
        lambda ps: torch.optim.Adam(ps, amsgrad=True),
        lambda ps: torch.optim.Adagrad(ps),
    ],
)
def test_unsupported_optimizer_raises_at_once(make):
    model = mlp()
    with pytest.raises(UnsupportedOptimizerError):
        training_model(model, make(model.parameters()), mse)


class Unsupported(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return torch.linalg.svd(self.fc(x))[0][:, :4]


@pytest.mark.parametrize("via", ["training_model", "compile"])
def test_failed_compile_leaves_the_model_untouched(via):
    model = Unsupported()
    before = copy.deepcopy(model.state_dict())
    x, y = data()
    with pytest.raises(UnsupportedError, match="svd"):
        if via == "compile":
            compile(model, CPU)(x)
        else:
            training_model(model, OPTIMIZERS["adamw"](model.parameters()), mse, CPU)(x, y)
    for name, value in before.items():
        assert torch.equal(model.state_dict()[name], value)


def test_out_of_memory_on_ipu_hw_names_torch_tensors(caplog):
    """A 196 MiB weight with its Adam state and gradient exceeds one IPU (897 MiB)."""
    model = nn.Linear(7168, 7168, bias=False)
    before = model.weight.detach().clone()
    opt = torch.optim.Adam(model.parameters())
    trainer = training_model(model, opt, mse)  # default device: ipu_hw
    x, y = torch.zeros(1, 7168), torch.zeros(1, 7168)
    with pytest.raises(
        OutOfMemoryError,
        match=r"(?s)does not fit one IPU.*<root>\s+196 MiB.*"
        r"Options\(replication_factor=2, replicated_tensor_sharding=True\).*device='ipu_model'",
    ):
        trainer(x, y)
    assert torch.equal(model.weight.detach(), before)  # untouched, bit for bit


def test_report_ir_and_schedule():
    model = mlp()
    trainer = training_model(model, OPTIMIZERS["adamw"](model.parameters()), mse, CPU)
    with pytest.raises(RuntimeError, match="run one step first"):
        trainer.print_schedule()
    trainer(*data())
    text = trainer.print_schedule()
    assert "main:" in text and "forward:" in text and "backward:" in text
    assert "AddcdivInplace" in text  # the AdamW update is in the program
    assert trainer.ir is trainer.session.ir
    assert "IPU memory (estimate" in trainer.report().summary()


class _LossAndItsCopy(nn.Module):
    """Returns ``(loss, output, loss)``: the loss a second time, as PopTorch's wrapped
    models return the loss the trainer takes beside the model's own outputs."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x, y):
        out = self.fc(x)
        loss = nn.functional.mse_loss(out, y)
        return loss, out, loss


def test_an_output_that_is_the_loss_is_fetched_once_and_read_as_the_loss():
    torch.manual_seed(0)
    model = _LossAndItsCopy()
    x, y = torch.randn(5, 4), torch.randn(5, 3)
    trainer = popxl_fx.Trainer(
        model, torch.optim.SGD(model.parameters(), lr=0.1), None, None, outputs=True
    )
    eager = model(x, y)
    loss = trainer(x, y)
    prog = trainer._active
    stores = [op for op in prog.ir.main_graph._ops if op.type == "HostStore"]
    assert len(stores) == 2  # the loss and the output, not the loss twice
    assert torch.equal(loss, eager[0]) and torch.equal(trainer.last["output.2"], eager[0])
    assert torch.equal(trainer.last["output.1"], eager[1])
    assert trainer.last["output.2"].data_ptr() != loss.data_ptr()  # each read is its own tensor
