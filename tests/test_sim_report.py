"""SimReport: golden memory arithmetic, totals/JSON, liveness, program tree, diff, plot, CLI."""

import json

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core import ops
from popxl_core import report as report_cli
from popxl_core.sim import calibration
from popxl_core.sim.cost import CODE_BYTES_PER_OP
from popxl_core.sim.machine import MK2
from popxl_core.sim.plan import build_plan

REQUIRED_KEYS = {
    "target",
    "peak_bytes_per_ipu",
    "capacity_bytes_per_ipu",
    "always_live_bytes",
    "not_always_live_peak_bytes",
    "code_bytes",
    "streaming_memory_bytes",
    "estimated_cycles",
    "estimated_seconds",
    "host_bytes_in",
    "host_bytes_out",
    "remote_bytes_loaded",
    "remote_bytes_stored",
}


def _layer(x, w, b):
    return ops.gelu(x @ w + b)


def _two_layers(outlined: bool):
    """Two identical 512 -> 512 layers on a batch of 8, inlined or one graph called twice."""
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.zeros((8, 512), np.float32), name="x")
        params = [
            popxl.variable(np.zeros(s, np.float32), name=f"{n}{i}")
            for i in range(2)
            for n, s in (("w", (512, 512)), ("b", (512,)))
        ]
        graph = ir.create_graph(_layer, x, *params[:2]) if outlined else None
        for i in range(2):
            w, b = params[2 * i : 2 * i + 2]
            x = ops.call(graph, x, w, b)[0] if outlined else _layer(x, w, b)
    return build_plan(ir, MK2)


# golden arithmetic ------------------------------------------------------------------------
def test_seed_mlp_weight_bytes_are_the_golden_figure():
    # 784-512-512-512-10 with biases: 932,362 float32 parameters (ipu_model.md §4)
    plan = build_plan(calibration.inference_ir(batch=1), MK2)
    assert plan.memory[0].variables == 3_729_448


def test_two_identical_layers_outlined_cost_half_the_code_of_the_inlined_pair():
    inlined, outlined = _two_layers(False), _two_layers(True)
    assert [g.name for g in outlined.graphs][0] == "main" and len(outlined.graphs) == 2
    layer_code = outlined.graphs[1].code_bytes  # counted once, however often it is called
    assert inlined.memory[0].code == 2 * layer_code
    assert outlined.memory[0].code == layer_code + 2 * CODE_BYTES_PER_OP  # + two call sites
    assert outlined.memory[0].code - 2 * CODE_BYTES_PER_OP == inlined.memory[0].code // 2
    diff = inlined.report().diff(outlined.report(), ("inlined", "outlined"))
    assert diff["code_bytes"] == (2 * layer_code, layer_code + 2 * CODE_BYTES_PER_OP)
    assert diff["variable_bytes"][0] == diff["variable_bytes"][1]
    assert "code_bytes" in str(diff) and "inlined" in str(diff)


# totals, JSON, text ------------------------------------------------------------------------
def test_to_dict_has_the_documented_keys_and_round_trips_through_json(tmp_path):
    report = _two_layers(True).report()
    data = report.to_dict()
    assert REQUIRED_KEYS <= set(data)
    m = report.plan.memory[0]
    assert data["peak_bytes_per_ipu"] == [m.total] and data["target"] == "ipu_hw"
    assert data["capacity_bytes_per_ipu"] == 1472 * 638_976
    assert data["always_live_bytes"] + data["not_always_live_peak_bytes"] == m.total
    assert data["streaming_memory_bytes"] == data["remote_bytes_loaded"] == 0
    assert data["estimated_seconds"] == pytest.approx(data["estimated_cycles"] / MK2.clock_hz)
    path = tmp_path / "r.json"
    assert (
        json.loads(report.to_json(path))
        == json.loads(path.read_text())
        == json.loads(json.dumps(data))
    )


def test_summary_op_table_and_program_tree():
    ir = popxl.Ir()
    with ir.main_graph:
        s = popxl.h2d_stream((4, 4), popxl.float32, "x")
        v = popxl.variable(np.ones((4, 4), np.float32), name="v")
        inner = ir.create_graph(lambda a: a * a, v)
        body = ir.create_graph(lambda a: ops.call(inner, a)[0] + a, v)
        (y,) = ops.repeat(body, 3, ops.host_load(s))
        ops.host_store(popxl.d2h_stream((4, 4), popxl.float32, "y"), y)
    report = build_plan(ir, MK2).report()
    text = report.summary()
    assert "Streaming Memory: 0 remote buffer(s), 0 B" in text and "not a measurement" in text
    tree = report.program_tree().splitlines()
    assert tree[0].startswith("main graph: ")
    assert any(line.startswith("  HostLoad.") for line in tree)
    repeat = next(i for i, line in enumerate(tree) if line.startswith("  repeat(3) "))
    assert tree[repeat + 1].startswith("    call ") and tree[repeat + 2].startswith(
        "      1 compute"
    )
    node = report.to_dict()["program_tree"]["children"]
    assert [c["kind"] for c in node] == ["HostLoad", "repeat(3)", "HostStore"]
    table = report.op_table().splitlines()
    assert table[0].split()[:3] == ["graph", "op", "ipu"] and len(table) == 1 + len(report.plan.ops)


# liveness ------------------------------------------------------------------------------------
def test_liveness_lists_and_expands_calls_and_repeats():
    plan = _two_layers(True)
    report = plan.report()
    flat = report.liveness(expand=False)
    assert flat == [(op, s.get(0, 0)) for op, s in zip(plan.liveness.steps, plan.liveness.curve)]
    expanded = report.liveness()
    # each call shows its callee's matmul, add, gelu (16 KiB outputs); across the second call
    # the first call's output stays live as its input
    k = 16384
    assert [b for _, b in expanded] == [k, 2 * k, 2 * k, 2 * k, 3 * k, 3 * k]
    assert [n.split("/")[1].split(".")[0] for n, _ in expanded] == ["MatMul", "Add", "Gelu"] * 2
    assert max(b for _, b in expanded) == plan.memory[0].activations
    assert report.to_dict()["liveness_expanded"]["0"] == [list(x) for x in expanded]


def test_liveness_plot_is_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = _two_layers(True).report().plot_liveness(tmp_path / "live.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# python -m popxl_core.report: its main, in this process (the script runs as __main__) -------------
def test_report_cli_writes_every_session_a_script_builds(tmp_path, capsys):
    script = tmp_path / "prog.py"
    script.write_text(
        "import sys\nimport numpy as np\nimport popxl_core as popxl\nfrom popxl_core import ops\n"
        "for n in (2, int(sys.argv[1])):\n"
        "    ir = popxl.Ir()\n"
        "    with ir.main_graph:\n"
        "        v = popxl.variable(np.ones(n, np.float32), name='v')\n"
        "        ops.identity(v)\n"
        "    popxl.Session(ir, 'ipu_hw')\n"
    )
    out = tmp_path / "reports"
    assert report_cli.main(["--out", str(out), str(script), "5"]) == 0
    assert "2 Session(s)" in capsys.readouterr().out
    for i, n in ((1, 2), (2, 5)):
        data = json.loads((out / f"session_{i}.json").read_text())
        assert data["variable_bytes"] == 4 * n
        assert (out / f"session_{i}.txt").read_text().startswith("IPU memory (estimate, ipu_hw")


def test_report_cli_reports_a_session_that_ran_out_of_memory(tmp_path, capsys):
    script = tmp_path / "oom.py"
    script.write_text(
        "import numpy as np\nimport popxl_core as popxl\n"
        "ir = popxl.Ir()\n"
        "with ir.main_graph:\n"
        "    popxl.variable(np.broadcast_to(np.float32(0), (30000, 10000)), name='huge')\n"
        "popxl.Session(ir, 'ipu_hw')\n"
    )
    assert report_cli.main(["--out", str(tmp_path / "r"), str(script)]) == 1
    assert "Out of memory on IPU 0 of 'ipu_hw'" in capsys.readouterr().err
    data = json.loads((tmp_path / "r" / "session_1.json").read_text())
    assert data["out_of_memory"] == [0] and data["variable_bytes"] == 1_200_000_000


class _Untouchable:
    def __getattr__(self, name):
        raise AssertionError(f"Session.run used the plan ({name})")


def test_run_never_touches_the_plan():
    ir = popxl.Ir()
    with ir.main_graph:
        s = popxl.h2d_stream((4,), popxl.float32, "x")
        w = popxl.variable(np.ones(4, np.float32), name="w")
        o = popxl.d2h_stream((4,), popxl.float32, "y")
        ops.host_store(o, ops.host_load(s) * w)
    session = popxl.Session(ir, "ipu_hw")
    session.plan = _Untouchable()  # any per-step use of the estimate would raise
    with session:
        for _ in range(3):
            out = session.run({s: np.arange(4, dtype=np.float32)})
    np.testing.assert_array_equal(out[o], np.arange(4, dtype=np.float32))
