"""The torchvision classification set against eager, bit for bit (benchmarks/torchvision_table):
eval forward (under no_grad) and 2 SGD-momentum steps in train mode with dropout as built,
random init, num_classes=10, the smallest input each builder accepts (batch 2, doubled while
eager's own 2 steps give non-finite weights; a program over one simulated IPU's memory runs
with Options(device="cpu")).

Slow tier. CI runs `FAMILY_SAMPLE` (11 light builders of the families tests/test_fx_models.py
does not already train: small custom Swin V1 and V2, both RegNets among them);
``POPXL_FX_TORCHVISION_ALL=1`` runs every builder (80 + the 2 small Swins; hours on 2 cores),
those too large for the host skipped with the reason.
"""

import os

import pytest

from benchmarks.torchvision_table import FAMILY_SAMPLE, builders, measure, too_large

NAMES = builders() if os.environ.get("POPXL_FX_TORCHVISION_ALL") else FAMILY_SAMPLE


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_torchvision_classifier_matches_eager(name):
    why = too_large(name)
    if why:
        pytest.skip(why)
    row = measure(name)
    assert row.forward_diff == 0.0 and row.param_diff == 0.0, row
