"""The lowering table's torch-level entries (``torch.cat``, ``F.softplus``, ``x.var``, ...)
against eager on the first OpInfo sample of every op they lower, forward and gradient,
bit for bit (slow tier: ~300 ops). It found the compositions that rounded differently from
torch's kernels (addmm, var/std, norms, softplus, ...), now torch's own kernels."""

import pytest
import torch

from popxl_fx.lowering import lookup

from .fx_harness import check_lowering
from .test_fx_core_aten import _CALLS, _eager_differentiates, _module, _sample_call

# OpInfo name -> why its sample is not compared here
NOT_COMPARED = {
    "empty_like": "its values are undefined",
    "norm:nuc": "refused: needs an SVD (popxl_fx says so)",
    "nn.functional.batch_norm": "the harness differentiates the running statistics too",
    "nn.functional.batch_norm:without_cudnn": "as batch_norm",
    "nn.functional.instance_norm": "as batch_norm",
    "nn.functional.binary_cross_entropy": "the harness captures on random inputs outside [0, 1]",
}
FLOAT32_COTANGENTS_ONLY = {"softmax:with_dtype", "log_softmax:with_dtype"}  # float64 outputs


def _ops(config) -> list:
    """One param per OpInfo the table lowers. Under the fast suite's exact ``-m "not slow"``
    (setup.cfg) every one of them would be deselected: then a single (deselected) placeholder
    stands for them, and torch's OpInfo database (~2 s to import, in each worker) is left out
    of the collection."""
    if config.getoption("markexpr").replace(" ", "") == "notslow":
        return [pytest.param(None, id="opinfo-not-listed-under-not-slow")]
    from torch.testing._internal.common_methods_invocations import op_db

    found = []
    for op in op_db:
        name = f"{op.name}:{op.variant_test_name}" if op.variant_test_name else op.name
        if lookup(op.op) is not None and name not in NOT_COMPARED:
            found.append(pytest.param(op, id=name))
    return found


def pytest_generate_tests(metafunc):
    if "op" in metafunc.fixturenames:
        metafunc.parametrize("op", _ops(metafunc.config))


@pytest.mark.slow
def test_table_lowering_matches_eager_on_the_first_opinfo_sample(op):
    sample = next(iter(op.sample_inputs("cpu", torch.float32, requires_grad=False)))
    call, tensors = _sample_call(op, sample, False)
    try:
        call(*[t.clone() for t in tensors])
    except Exception as exc:  # eager itself rejects this sample
        pytest.skip(f"eager rejects the sample: {exc}")
    key = f"table-{op.name}-{op.variant_test_name}"
    _CALLS[key] = call
    name = f"{op.name}:{op.variant_test_name}" if op.variant_test_name else op.name
    grad = (
        op.supports_autograd
        and name not in FLOAT32_COTANGENTS_ONLY
        and _eager_differentiates(call, tensors)
    )
    check_lowering(_module(key, len(tensors), True), *tensors, rtol=0, atol=0, grad=grad)
