"""The refused option combinations are one table (`popxl_fx.refusals`), checked in one place
by each entry point: the rows raise through the public API with the table's message."""

import pytest
from torch import nn

import popxl_fx
from popxl_fx import Options
from popxl_fx.refusals import REFUSALS, WHERE, refuse


def test_every_row_names_known_check_points():
    assert REFUSALS
    assert all(row.where and set(row.where) <= set(WHERE) for row in REFUSALS)


def test_unknown_check_point_raises():
    with pytest.raises(ValueError, match="unknown refusal check point 'nowhere'"):
        refuse("nowhere", Options())


def test_options_rows_checked_when_options_are_made():
    with pytest.raises(ValueError, match="chooses outline itself"):
        Options(memory="auto", outline="auto")


def test_entry_rows_checked_by_their_entry_only():
    opts = Options(device="cpu", gradient_accumulation=2)
    with pytest.raises(ValueError, match=r"gradient_accumulation=2\) accumulates gradients; "):
        popxl_fx.inference_model(nn.Linear(2, 2), opts)
    with pytest.raises(ValueError, match="compile refuses it"):
        popxl_fx.compile(nn.Linear(2, 2), opts)
    refuse("training_model", opts)  # training applies it


def test_first_applying_row_is_raised():
    # both the outline and the device_iterations row apply: the table's order decides
    opts = Options(device="cpu", phased_execution="blocks", outline="auto", device_iterations=2)
    with pytest.raises(ValueError, match="does not combine with outline='auto' yet"):
        refuse("phased", opts)
    refuse("training_model", opts)  # phased rows are checked by the phased step only


def test_loss_scaling_applies_to_any_training_precision_but_not_to_compile():
    opts = Options(device="cpu", loss_scaling=2.0)  # PopTorch scales every model's loss
    refuse("training_model", opts)
    with pytest.raises(ValueError, match=r"loss_scaling=2.0\) scales the loss of training_model"):
        popxl_fx.compile(nn.Linear(2, 2), opts)
