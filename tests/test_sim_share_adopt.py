"""A framework's tensor shared while the replicas share a variable (uniform.py) becomes that
variable's value on every replica at once (`SharedRuns.adopt`): popxl_fx hands torch's Adam
state over after the first step, and the sharing stays active (no per-replica copies to make
and check again), with the same numbers as the program without sharing."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

import popxl_fx
from popxl_core.sim import CompileOptions

SHARED, UNSHARED = CompileOptions(fold_replicas=False), CompileOptions(share_uniform=False)


def _trainer(compiler: CompileOptions):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    options = popxl_fx.Options(device="cpu", replication_factor=2, compiler=compiler)
    return popxl_fx.training_model(model, opt, F.cross_entropy, options), model, opt


def _steps(trainer, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    data = [
        (torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g)) for _ in range(n)
    ]
    return torch.stack([trainer(x, y) for x, y in data])


def test_torchs_state_handed_over_is_every_replicas_value_and_sharing_stays_on():
    trainer, _, opt = _trainer(SHARED)
    _steps(trainer, 1)  # after it: torch's exp_avg/exp_avg_sq shared with the Session
    session = trainer._programs.active.session
    assert session._replicas.sharing.active
    state = {t.data_ptr() for s in opt.state.values() for k, t in s.items() if k == "exp_avg"}
    device = session._device
    rows = [i for i, t in enumerate(device[0]) if t is not None and t.data_ptr() in state]
    assert len(rows) == len(state) == 4  # two weights, two biases
    assert set(rows) <= set(session._program.sharing.variables)
    assert all(device[1][i] is device[0][i] for i in rows)


def test_the_same_numbers_as_without_sharing():
    shared, model, opt = _trainer(SHARED)
    plain, model0, opt0 = _trainer(UNSHARED)
    assert torch.equal(_steps(shared, 3), _steps(plain, 3))
    for a, b in zip(model.state_dict().values(), model0.state_dict().values()):
        assert torch.equal(a, b)
    for s, s0 in zip(opt.state.values(), opt0.state.values()):
        assert all(torch.equal(s[k], s0[k]) for k in s)
