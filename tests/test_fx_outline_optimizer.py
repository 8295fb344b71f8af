"""``Options(outline="auto")`` outlines each block's optimizer update too (issue 34).

The GPT-style decoder of tests/fx_zoo.py with Adam: before, the forward and backward of its
blocks were one graph each but every block's update stayed inline (a 6-block GPT kept 72 % of
the inlined program's code, a 24-block one 66 %). Now one update graph per block shape is
called once per block: measured 23.6 % (6 blocks), 12.6 % (12) and 6.8 % (24) of the inlined
code. The test builds 6 and 12 blocks (a 24-block pair took 8 s of CPU, the 12-block one 4.5 s,
and shows the same fall).
The update graph holds the inline update's ops in the same order, so every comparison here
is bit for bit against the inlined program (losses, parameters, optimizer state after 2
steps), also with param groups that split a block, a frozen parameter, gradient
accumulation, device iterations, replication with RTS, and IPUAdam's float16 state.
"""

from __future__ import annotations

import pytest
import torch

import popxl_fx
from popxl_fx import Options, training_model
from tests.fx_zoo import GPT

CPU = Options(device="cpu")


def _train(layers: int, options: Options, make_opt, batch: int = 2, freeze: bool = False):
    torch.manual_seed(0)
    model = GPT(layers=layers)
    if freeze:  # block 1 no longer has its blocks' structure: it stays inline
        model.blocks[1].ln1.weight.requires_grad_(False)
    g = torch.Generator().manual_seed(1)
    n = batch * options.device_iterations
    idx, targets = (torch.randint(0, 64, (n, 16), generator=g) for _ in range(2))
    if options.device_iterations > 1:
        idx, targets = (t.view(options.device_iterations, batch, 16) for t in (idx, targets))
    opt = make_opt(model)
    trainer = training_model(model, opt, options=options)
    losses = torch.stack([trainer(idx, targets) for _ in range(2)])
    state = {k: v.clone() for k, v in model.state_dict().items()}
    return trainer, losses, state, opt.state_dict()["state"]


def _assert_bitwise(a, b) -> None:
    assert torch.equal(a[1], b[1]), (a[1], b[1])
    for k in a[2]:
        assert torch.equal(a[2][k], b[2][k]), k
    assert a[3].keys() == b[3].keys()
    for i in a[3]:
        for key in a[3][i]:
            assert torch.equal(a[3][i][key], b[3][i][key]), (i, key)


def _update_calls(trainer) -> dict[str, int]:
    sites = trainer.report().outlining().call_sites
    return {k: v for k, v in sites.items() if k.startswith("optimizer_update")}


def _adam(model):
    return torch.optim.Adam(model.parameters(), lr=1e-3)


@pytest.mark.parametrize("layers, share", [(6, 0.5), (12, 0.25)])
def test_adam_update_is_one_graph_per_block_shape(layers, share):
    inlined = _train(layers, CPU, _adam)
    outlined = _train(layers, CPU.replace(outline="auto"), _adam)
    assert _update_calls(outlined[0]) == {"optimizer_update_blocks_subgraph(2)": layers}
    code = outlined[0].report().totals()["code_bytes"]
    assert code < share * inlined[0].report().totals()["code_bytes"]
    _assert_bitwise(inlined, outlined)


def _decay_groups(model):
    """GPT-style: weight decay on the matrices only (each block's parameters in two groups)."""
    named = list(model.named_parameters())
    matrices = [p for _, p in named if p.dim() >= 2]
    rest = [p for _, p in named if p.dim() < 2]
    groups = [{"params": matrices, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=1e-3)


@pytest.mark.parametrize(
    "options",
    [
        CPU,
        CPU.replace(gradient_accumulation=2),
        CPU.replace(device_iterations=2),
        CPU.replace(replication_factor=2, replicated_tensor_sharding=True),
    ],
    ids=["plain", "accumulation", "device_iterations", "rts"],
)
def test_param_groups_split_blocks_into_an_update_graph_each(options):
    inlined = _train(3, options, _decay_groups, batch=4, freeze=True)
    outlined = _train(3, options.replace(outline="auto"), _decay_groups, batch=4, freeze=True)
    # blocks 0 and 2 outline (block 1 has a frozen parameter); one graph per param group
    assert sorted(_update_calls(outlined[0]).values()) == [2, 2]
    _assert_bitwise(inlined, outlined)


@pytest.mark.parametrize(
    "make_opt",
    [
        lambda m: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, nesterov=True),
        lambda m: popxl_fx.IPUAdam(
            m.parameters(), lr=1e-3, bias_correction=False, first_order_dtype=torch.float16
        ),
    ],
    ids=["sgd_nesterov", "ipu_adam_float16_state"],
)
def test_other_optimizers_outline_their_updates_bitwise(make_opt):
    inlined = _train(4, CPU, make_opt)
    outlined = _train(4, CPU.replace(outline="auto"), make_opt)
    assert list(_update_calls(outlined[0]).values()) == [4]
    _assert_bitwise(inlined, outlined)
