"""Host memory: the Session holds one copy of every value, whatever its placement.

Counted on storages (`popxl_core.sim.host_bytes`), never on resident memory: a phased
trainer's remote buffers are the torch parameters and optimizer state themselves, so it
holds no more beside torch's tensors than the plain trainer does; a remote variable in a
buffer of its own shares a given tensor's storage, and its buffer is not made before a run.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

import popxl_core as popxl
import popxl_fx
from popxl_core import ops
from popxl_core.sim.host_bytes import held_storages, reachable_storages, storage_key
from tests.fx_zoo import GPT

STEPS = 2


def _data() -> list:
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randint(0, 64, (2, 16), generator=g), torch.randint(0, 64, (2, 16), generator=g))
        for _ in range(STEPS)
    ]


def _torch_tensors(model, opt) -> list[torch.Tensor]:
    state = [t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    return [*model.parameters(), *model.buffers(), *state]


RTS = (("replication_factor", 2), ("replicated_tensor_sharding", True))


@functools.lru_cache(maxsize=None)
def _trained(phased, extra: tuple = ()) -> tuple:
    """(trainer, model, optimizer, losses) after `STEPS` steps; built once per module for
    the tests that count what one trainer holds (``extra``: more `Options` fields)."""
    torch.manual_seed(0)
    model = GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    options = popxl_fx.Options(device="cpu", phased_execution=phased, **dict(extra))
    trainer = popxl_fx.training_model(model, opt, options=options)
    return trainer, model, opt, [float(trainer(x, y)) for x, y in _data()]


def _train(phased, count=None, extra: tuple = ()) -> tuple:
    """(losses, bytes the Session holds beside torch's tensors, torch's tensors' bytes);
    ``count``: what is counted as held (`held_storages` of the Session by default)."""
    trainer, model, opt, losses = _trained(phased, extra)
    tensors = _torch_tensors(model, opt)
    theirs = {storage_key(t)[0] for t in tensors}
    held = count(trainer) if count else held_storages(trainer.session)
    beside = sum(n for address, n in held.items() if address not in theirs)
    return losses, beside, sum(t.nbytes for t in tensors)


def test_phased_holds_no_more_beside_torch_than_plain():
    plain, plain_beside, weights_and_state = _train(False)
    phased, phased_beside, _ = _train("blocks")
    assert phased == plain  # bit for bit
    # before: each phased parameter and state tensor had a remote buffer and a host copy too
    assert phased_beside <= plain_beside, (phased_beside, plain_beside, weights_and_state)
    assert plain_beside < weights_and_state / 100  # the plain trainer shares them all


def _remote_program(shape=(3, 4)):
    ir = popxl.Ir()
    with ir.main_graph:
        buf = popxl.remote_buffer(shape, popxl.float32, 1)
        var = popxl.remote_variable(np.ones(shape, np.float32), buf, 0, name="w")
        loaded = ops.remote_load(buf, 0)
        ops.remote_store(buf, 0, loaded + 1.0)
    return ir, var


def test_a_remote_variable_of_its_own_buffer_is_the_shared_tensor():
    ir, var = _remote_program()
    t = torch.full((3, 4), 5.0)
    with popxl.Session(ir, "ipu_model") as session:
        assert session.storage_shareable(var)
        assert session._runtime.remote[next(iter(ir._remote_buffers.values()))] is None
        session.share_variable_storage({var: t})
        session.run()
        session.run()
        assert torch.equal(t, torch.full((3, 4), 7.0))  # updated in place, no copy
        t.add_(1.0)  # the user's write is what the next run reads
        session.run()
        np.testing.assert_array_equal(session.get_tensor_data(var), np.full((3, 4), 9.0))
        assert storage_key(session._remote.entry(var, 0)) == storage_key(t)


def test_an_unshared_remote_variable_is_made_from_its_host_value_at_the_first_run():
    ir, var = _remote_program()
    with popxl.Session(ir, "ipu_model") as session:
        assert session.get_tensor_data(var).tolist() == np.ones((3, 4)).tolist()
        session.run()
        np.testing.assert_array_equal(session.get_tensor_data(var), np.full((3, 4), 2.0))
        owned = session.device_tensor(var)  # the buffer's storage, adopted
        owned.mul_(3.0)
        session.run()
        np.testing.assert_array_equal(session.get_tensor_data(var), np.full((3, 4), 7.0))


@pytest.mark.parametrize("replicas", [2])
def test_replicated_remote_variables_are_not_shareable(replicas):
    ir, var = _remote_program()
    ir.replication_factor = replicas
    with popxl.Session(ir, "ipu_model") as session:
        assert not session.storage_shareable(var)


def test_phased_rts_shards_are_slices_of_the_torch_tensors():
    plain, _, _ = _train(False, extra=RTS)
    phased, phased_beside, weights_and_state = _train("blocks", extra=RTS)
    assert phased == plain  # bit for bit
    # before: every shard had a remote buffer and the host a copy of the whole (2x)
    assert phased_beside < weights_and_state / 100, (phased_beside, weights_and_state)


def test_writing_a_remote_variable_not_made_yet_keeps_it_unmade_until_a_run():
    """popxl_fx writes zeros into the optimizer state it has no torch tensor for at attach:
    the buffers are made at the first run, from the value written (not at the write)."""
    ir, var = _remote_program()
    buffer = next(iter(ir._remote_buffers.values()))
    with popxl.Session(ir, "ipu_model") as session:
        session.write_variable_data(var, np.full((3, 4), 4.0, np.float32))
        assert session._runtime.remote[buffer] is None
        session.run()
        np.testing.assert_array_equal(session.get_tensor_data(var), np.full((3, 4), 5.0))


@pytest.mark.parametrize("extra", [(), RTS])
def test_a_phased_trainer_keeps_no_buffers_between_steps(extra):
    """Everything the trainer keeps alive between steps (kernels' kept buffers included),
    beside torch's tensors. Before: each phase's weight gradient GEMMs kept their output
    buffer (228,708 bytes here: about the parameters' 221,952) and, with RTS, each gradient
    reduction its result (435,760 bytes); now 23,908 and 26,160: a phased step holds one
    phase's gradients at a time, as phasing means to."""
    params = sum(p.nbytes for p in GPT().parameters())
    _, beside, _ = _train("blocks", count=reachable_storages, extra=extra)
    assert beside < params / 4, (beside, params)


def test_reachable_storages_sees_a_buffer_kept_in_a_partial():
    """The counter follows closures and partials (where kernels keep buffers)."""
    import functools

    kept = torch.zeros(1000)
    fn = functools.partial(torch.mm, out=kept)

    def closure():
        return fn

    counted = reachable_storages({"kernel": closure})
    assert counted[storage_key(kept)[0]] == 4000


def _allocation_peak(fn) -> int:
    """The most bytes of torch tensors ``fn()`` allocated and held at once."""
    from torch._C._profiler import _EventType

    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, profile_memory=True) as prof:
        fn()
    events = []

    def walk(node):
        if node.tag == _EventType.Allocation:  # alloc_size < 0: a free
            events.append((node.start_time_ns, node.extra_fields.alloc_size))
        for child in node.children:
            walk(child)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root)
    held = peak = 0
    for _, n in sorted(events):
        held += n
        peak = max(peak, held)
    return peak


def _step_peak(phased) -> int:
    torch.manual_seed(0)
    model = GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    options = popxl_fx.Options(device="cpu", phased_execution=phased)
    trainer = popxl_fx.training_model(model, opt, options=options)
    (x, y), (x2, y2) = _data()
    trainer(x, y)  # the optimizer state is made at the first step
    return _allocation_peak(lambda: trainer(x2, y2))


def test_a_phased_step_loads_no_copy_of_its_weights_and_state():
    """A phase's weights and AdamW state are updated in their Streaming Memory entries (the
    torch tensors), as eager updates them (`sim.remote_views`). Peak of a step's torch
    allocations, plain 315,652 bytes; phased before 427,060 (each phase's loads copied),
    now 327,940."""
    plain, phased = _step_peak(False), _step_peak("blocks")
    assert phased < 1.1 * plain, (phased, plain)


def _params() -> int:
    return sum(p.nbytes for p in GPT().parameters())  # 221,952 bytes


def _beside_torch_and_session(program_owner, session, torch_tensors) -> int:
    """Bytes ``program_owner`` keeps alive that are neither torch's tensors nor reachable from
    its Session (the Session's values and kernels' buffers): what the build left behind."""
    theirs = {storage_key(t)[0] for t in torch_tensors} | set(reachable_storages(session))
    return sum(n for a, n in reachable_storages(program_owner).items() if a not in theirs)


@pytest.mark.parametrize("outline", [False, "auto"])
def test_a_built_trainer_keeps_no_example_values(outline):
    """The capture runs the example inputs through the model and records every node's value
    (`node.meta["example_value"]`: one forward's activations). Once the build is done only
    their shapes and dtypes are read, so they become meta tensors. Before: the plain trainer
    kept 316,632 bytes beside torch's tensors and its Session on the test GPT (more than its
    221,952 bytes of parameters), 431,836 outlined."""
    torch.manual_seed(0)
    model = GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    options = popxl_fx.Options(device="cpu", outline=outline)
    trainer = popxl_fx.training_model(model, opt, options=options)
    for x, y in _data():
        trainer(x, y)
    left = _beside_torch_and_session(trainer, trainer.session, _torch_tensors(model, opt))
    # now 212 bytes: the weightless variable factories' broadcast zeros (4 bytes a variable)
    assert left < _params() / 100, left


def test_a_built_inference_model_keeps_no_example_values():
    torch.manual_seed(0)
    model = GPT().eval()
    runner = popxl_fx.inference_model(model, popxl_fx.Options(device="cpu"))
    x, y = _data()[0]
    with torch.no_grad():
        torch.testing.assert_close(runner(x, y), model(x, y), rtol=0, atol=0)
    left = _beside_torch_and_session(
        runner, runner.session, [*model.parameters(), *model.buffers()]
    )
    assert left < _params() / 100, left  # before: 315,908 bytes (the activations of x, y)


def test_reachable_storages_counts_no_bytes_for_a_meta_tensor():
    counted = reachable_storages([torch.empty(1000, device="meta"), torch.zeros(4)])
    assert sorted(counted.values()) == [16]


def test_a_meta_twin_keeps_what_readers_ask_of_an_example_value():
    from popxl_fx.example_values import meta_twin

    base = torch.randn(4, 6, requires_grad=True)
    view = base.detach()[1:, ::2]  # an offset, strides of a view
    for t in (view, base * 2, torch.arange(5), torch.nn.Parameter(torch.ones(3))):
        twin = meta_twin(t)
        assert twin.device.type == "meta" and type(twin) is type(t)
        got = (twin.shape, twin.stride(), twin.storage_offset(), twin.dtype, twin.requires_grad)
        assert got == (t.shape, t.stride(), t.storage_offset(), t.dtype, t.requires_grad)
