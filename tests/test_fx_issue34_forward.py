"""What forward does besides its tensor work, and the ways into a trainer (issue 34): a
``print`` of text in forward is warned about with the user's line (it prints at capture only),
and a trainer without a loss_fn given a target names the missing loss_fn instead of forward's
bare argument error."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from popxl_fx import Options, check, training_model

CPU = Options(device="cpu")


def _line(text: str) -> str:
    with open(__file__) as f:
        lines = [i for i, line in enumerate(f, 1) if text in line and "_line(" not in line]
    assert len(lines) == 1, (text, lines)
    return f"{__file__}:{lines[0]}"


class PrintsText(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 1)

    def forward(self, x):
        print("forward on a batch of", x.shape[0])  # text-print-line
        return self.fc(x).sum()


X = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))


def test_print_of_text_is_reported_with_the_users_line():
    issues = [i for i in check(PrintsText(), X).issues if i.kind == "print in forward"]
    assert [i.source for i in issues] == [_line("# text-print-line")]


def test_print_of_text_warns_once_and_trains_like_eager(capsys):
    model, reference = PrintsText(), PrintsText()
    trainer = training_model(model, torch.optim.SGD(model.parameters(), lr=0.1), options=CPU)
    with pytest.warns(UserWarning, match="print in forward") as record:
        first = trainer(X)
    assert _line("# text-print-line") in str(record[0].message)
    assert "forward on a batch of" in capsys.readouterr().out  # it printed, at capture
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning, and nothing printed on the step
        second = trainer(X)
    assert capsys.readouterr().out == ""
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for loss in (first, second):
        opt.zero_grad()
        ref = reference(X)
        ref.backward()
        opt.step()
        assert torch.equal(loss, ref.detach())


def test_a_target_without_a_loss_fn_names_the_missing_loss_fn():
    model = nn.Sequential(nn.Linear(4, 2))
    trainer = training_model(model, torch.optim.SGD(model.parameters(), lr=0.1), options=CPU)
    with pytest.raises(TypeError, match=r"no loss_fn.*Sequential has no loss.*loss_fn=") as err:
        trainer(X, torch.randn(5, 2))
    assert "positional arguments but" not in str(err.value)
