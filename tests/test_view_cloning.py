"""`kernel_wrappers.cloning`, the compiler's wrapper of a view op whose result may not alias
its input: a result sharing the input's storage (a view, the input itself, a detached alias)
is copied; a result torch already made a copy of (reshape of a transposed tensor) is returned
as it is, once."""

import pytest
import torch

from popxl_core.sim.kernel_wrappers import cloning


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


@pytest.mark.parametrize(
    "kernel",
    [
        lambda x: x.reshape(6, 4),
        lambda x: x[1],
        lambda x: x.permute(2, 0, 1),
        lambda x: x,
        lambda x: x.detach(),
        lambda x: x.to(torch.float32),
    ],
    ids=["reshape", "select", "permute", "itself", "detach", "same_dtype_to"],
)
def test_an_alias_of_the_input_is_copied(kernel):
    x = torch.randn(2, 3, 4)
    with torch.no_grad():
        got = cloning(kernel)(x)
    assert _storage(got) != _storage(x)
    assert torch.equal(got, kernel(x))


def test_a_copy_torch_made_is_not_copied_again():
    x = torch.randn(2, 3, 4).permute(0, 2, 1)  # not contiguous: reshape copies
    made = []

    def kernel(t):
        made.append(t.reshape(2, 12))
        return made[-1]

    with torch.no_grad():
        got = cloning(kernel)(x)
    assert got is made[0] and _storage(got) != _storage(x)
    assert torch.equal(got, x.reshape(2, 12))
