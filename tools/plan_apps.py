"""Plan Graphcore's PopXL applications at their full (POD) sizes and print the estimates.

The apps' benchmark scripts build their Session from a named configuration of their own
``config/*.yml`` (``--config NAME``) and then run it with dummy inputs. Their full-size weights
cannot be made here (GPT-3 175B is 350 GB of float16), so each script is run unchanged in
planning mode (``POPXL_SIM_PLAN=1``, `popxl_core.planning`): the program is built and planned
from shapes alone, the Session's report is written (``python -m popxl_core.report``), and the
script stops with `PlanOnlyError` where it would first need values.

Run by ``PLAN=1 tools/run_apps.sh EXAMPLES_GIT_DIR [APP...]``, which prepares each app's folder
and environment and calls ``python tools/plan_apps.py APP`` inside it; prints one Markdown table
row per configuration (IPU 0 of replica 0: every replica of these apps has the same plan).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from popxl_core.sim.units import fmt_bytes, fmt_seconds  # noqa: E402

__all__ = ["CONFIGS", "main", "plan_one"]

# app -> (script, named configuration of its config/*.yml under "release" or "phased")
CONFIGS = {
    "gpt_j": [
        ("inference.py", "gpt-j"),
        ("inference.py", "gpt-j-gq-4bit"),
        ("finetuning.py", "gptj_6B_1024_pod16"),
        ("finetuning.py", "gptj_6B_1024_pod64"),
    ],
    "gpt3_175B": [
        ("pretraining.py", "gpt3_2.7B_pod64"),
        ("pretraining.py", "gpt3_175B_pod256"),
    ],
    "gpt3_2.7B": [
        ("pretraining.py", "gpt3_2.7B_pod64"),
        ("generative_inference.py", "gpt3_2.7B_pod64"),
        ("mnli_finetuning.py", "cerebras_gpt_6_7B_pod64"),
        ("mnli_finetuning.py", "cerebras_gpt_13B_pod64"),  # "untested" in Graphcore's yml
    ],
    "bloom": [("inference.py", "bloom_560M_pod16"), ("inference.py", "bloom_176B_pod16")],
    "t5": [
        ("inference.py", "xl"),
        ("inference.py", "xxl"),
        ("finetuning.py", "xl_pod16"),
        ("finetuning.py", "xxl_pod16"),
        ("finetuning.py", "xxl_pod64"),
    ],
    "bert": [("pretraining.py", "large_128"), ("pretraining.py", "large_512")],
    "llama": [("inference.py", "llama2_7b_pod4"), ("inference.py", "llama2_70b_pod16")],
    "dolly": [("inference.py", "dolly_pod4"), ("inference.py", "dolly_pod16")],
    "magma": [("inference.py", "magma_v1_1024")],
}
HEADER = (
    "| app | script --config | IPUs | IPU memory (of 897 MiB) | variables on chip at most | "
    "Streaming Memory per IPU | time per run | build |\n|---|---|---|---|---|---|---|---|"
)
TIMEOUT_S = int(os.environ.get("PLAN_TIMEOUT", "1800"))


def plan_one(script: str, config: str, out: Path) -> tuple[list[dict], str, float]:
    """Run ``script --config config`` in planning mode; its Sessions' reports (as dicts), the
    last line of its output, and its wall time in seconds."""
    env = dict(os.environ, POPXL_SIM_PLAN="1")
    env.pop("POPXL_SIM_REPORT", None)  # the reports come from popxl_core.report here
    command = [sys.executable, "-m", "popxl_core.report", "--out", str(out)]
    args = [*command, script, "--config", config]
    clock = time.perf_counter()
    try:
        done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        text = done.stdout + done.stderr
    except subprocess.TimeoutExpired:
        text = f"timed out after {TIMEOUT_S} s"
    reports = [json.loads(p.read_text()) for p in sorted(out.glob("session_*.json"))]
    return reports, _last_line(text), time.perf_counter() - clock


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # a Python exception's line, else a compiler's (Llama's C++ op built by cppimport)
    errors = [line for line in lines if "Error" in line.split(":")[0]]
    errors = errors or [line for line in lines if "error:" in line]
    return (errors or lines or [""])[-1][:300]


def row(app: str, script: str, config: str, report: dict, seconds: float) -> str:
    """One table row from a Session's ``SimReport.to_dict()``."""
    mem = report["memory"]["0"]
    ipus = report["replication_factor"] * len(report["memory"])
    fits = "OOM" if report["out_of_memory"] else "fits"
    memory = f"{fmt_bytes(mem['total'])} ({mem['fraction']:.0%}, {fits})"
    remote = sum(b["nbytes"] for b in report["remote_buffers"])
    return (
        f"| {app} | {script} {config} | {ipus} | {memory} | "
        f"{fmt_bytes(mem['variables_on_chip_peak'])} | {fmt_bytes(remote)} | "
        f"{fmt_seconds(report['seconds'])} | {seconds:.0f} s |"
    )


def main(argv: list[str]) -> int:
    app = argv[0]
    print(HEADER)
    for script, config in CONFIGS[app]:
        with tempfile.TemporaryDirectory() as out:
            reports, last, seconds = plan_one(script, config, Path(out))
        if not reports:
            print(f"| {app} | {script} {config} | not planned: {last} |||||")
        for report in reports:
            print(row(app, script, config, report, seconds), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
