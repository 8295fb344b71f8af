#!/usr/bin/env bash
# Run Graphcore's PopXL applications' own pytest suites (graphcore/examples) against this project.
#
# Usage, from the project root:
#   tools/run_apps.sh EXAMPLES_GIT_DIR [APP...] [-- PYTEST_ARGS...]
#   EXAMPLES_GIT_DIR: a git dir of github:graphcore/examples (e.g. /work/.mirror/graphcore+examples/repo)
#   APP: gpt_j bert t5 gpt3_2.7B gpt3_175B bloom llama dolly magma tutorials (default: all)
# Environment: PYTHON (default .venv/bin/python); VENVS (default /work/venvs), holding overlays made
# with `pip install --target`: tf418, tf4251, tf431 (transformers 4.18.0 / 4.25.1 / 4.31.0) and
# common (huggingface_hub 0.16.4, tokenizers 0.13.3, requests, scipy, simple-parsing, examples-utils).
# For tutorials also: tutorials (nbformat, nbconvert, ipykernel) and mnist (MNIST/raw, IDX files);
# magma in place of a transformers overlay (Aleph-Alpha's magma, its transformers fork, deepspeed).
# The apps' files are read from the git dir at run time into a temporary folder; nothing of theirs
# is kept. What this runner adds there (sitecustomize.py, conftest.py, a one-instance popdist) is
# the environment the apps expect from their own requirements, not part of this project.
# Every Session writes its memory and time estimates (POPXL_SIM_REPORT); the runner prints those of
# the apps' end-to-end scripts (inference.py, finetuning.py, ...), KEEP_LOGS keeps them all.
# PLAN=1: instead of the tests, plan each app's full-size (POD) configurations in planning mode
# (POPXL_SIM_PLAN, no weights made) and print their memory and time estimates (tools/plan_apps.py).
# OMP_NUM_THREADS (default 1): torch's threads per process. On a shared 2-core host, two OpenMP
# threads wait for each other at every kernel: a tutorial's MNIST step took 85-230 ms with 2,
# 5 ms with 1 (eager PyTorch alike; benchmarks/RESULTS.md). Tests compare within one process,
# so both sides of a comparison run with the same count. APP_TIMEOUT (default 4800): seconds per
# app's pytest; the tutorials' 13 tests took 53 minutes at load average 8 to 11.
set -u
GITDIR=${1:?usage: tools/run_apps.sh EXAMPLES_GIT_DIR [APP...] [-- PYTEST_ARGS...]}; shift
APPS=(); while [[ $# -gt 0 && $1 != -- ]]; do APPS+=("$1"); shift; done; [[ ${1:-} == -- ]] && shift
[[ ${#APPS[@]} == 0 ]] && APPS=(gpt_j bert t5 gpt3_2.7B gpt3_175B bloom llama dolly magma tutorials)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
ROOT=$PWD; PY=${PYTHON:-.venv/bin/python}; [[ $PY == /* ]] || PY=$ROOT/$PY; VENVS=${VENVS:-/work/venvs}
declare -A PATHS=([gpt_j]=nlp/gpt_j/popxl [bert]=nlp/bert/popxl [t5]=nlp/t5/popxl
  [gpt3_2.7B]=nlp/gpt3_2.7B/popxl [gpt3_175B]=nlp/gpt3_175B/popxl [bloom]=nlp/bloom/popxl
  [llama]=nlp/llama/popxl [dolly]=nlp/dolly/popxl [magma]=multimodal/magma/popxl
  [tutorials]=tutorials/tutorials/popxl)
declare -A TF=([bert]=tf418 [gpt3_2.7B]=tf418 [llama]=tf431 [gpt3_175B]=tf431 [magma]=magma)
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
# the mirror may lack its largest blobs (images, notebooks): export the files that are there
git --git-dir="$GITDIR" ls-tree -r HEAD utils tutorials/utils \
  $(for a in "${APPS[@]}"; do echo "${PATHS[$a]}"; done) | while read -r _ _ sha path; do
  mkdir -p "$work/$(dirname "$path")"
  git --git-dir="$GITDIR" cat-file blob "$sha" >"$work/$path" 2>/dev/null || rm -f "$work/$path"
done
mkdir -p "$work/site/popdist"
cat >"$work/site/sitecustomize.py" <<'PY'
# Every python process of the apps' runs (pytest and the scripts it starts) sees popxl here.
import dataclasses

_get_field = dataclasses._get_field


def _get_field_310(cls, a_name, a_type, *args):
    # Python 3.11 refuses any unhashable default; 3.10 (the apps' Python) only lists/dicts/sets
    default = cls.__dict__.get(a_name, dataclasses.MISSING)
    kind = type(default)
    if kind.__hash__ is None and not isinstance(default, (list, dict, set)):
        kind.__hash__ = object.__hash__
        try:
            return _get_field(cls, a_name, a_type, *args)
        finally:
            kind.__hash__ = None
    return _get_field(cls, a_name, a_type, *args)


dataclasses._get_field = _get_field_310
import popxl_core.compat  # noqa: E402

popxl_core.compat.install()
PY
cat >"$work/site/popdist/__init__.py" <<'PY'
# popdist outside poprun: one instance, as Graphcore's popdist reports it there.
def isPopdistEnvSet(): return False
def getInstanceIndex(): return 0
def getNumInstances(): return 1
def getNumTotalReplicas(): return 1
def getNumLocalReplicas(): return 1
def getReplicaIndexOffset(): return 0
def getDeviceId(): return 0
def init(): pass
PY
# the tutorials read MNIST from ~/.torch/datasets (torchvision finds it there and downloads nothing)
mkdir -p "$work/home/.torch/datasets" && ln -s "$VENVS/mnist/MNIST" "$work/home/.torch/datasets/MNIST"
total_p=0; total_f=0
for a in "${APPS[@]}"; do
  dir="$work/${PATHS[$a]}"
  cat >"$dir/conftest.py" <<'PY'
import pytest
import popxl_core.compat
from popxl_core.compat_skips import pytest_collection_modifyitems as _project_skips

popxl_core.compat.install()


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    # a test module whose import exits (Llama's and Dolly's cppimport op fails to build without
    # PopART's headers) is that file's collection error, not the end of the whole session
    try:
        return (yield)
    except SystemExit as exc:
        return pytest.CollectReport(collector.nodeid, "failed", f"SystemExit at import: {exc}", [])


def pytest_collection_modifyitems(config, items):
    # Graphcore's top-level conftest: long tests only with --long-tests
    _project_skips(config, items)
    long_ok = config.getoption("--long-tests", default=False)
    for item in items:
        if "long_test" in item.keywords and not long_ok:
            item.add_marker(pytest.mark.skip(reason="long test (Graphcore's conftest)"))
PY
  overlay="$work/site:$VENVS/${TF[$a]:-tf4251}:$VENVS/common:$VENVS/wandb"
  tests=tests; [[ $a == tutorials ]] && tests=. && overlay="$overlay:$VENVS/tutorials"
  if [[ -n ${PLAN:-} ]]; then  # the POD configurations, planned weightless (tools/plan_apps.py)
    ( cd "$dir" && HOME="$work/home" PATH="$(dirname "$PY"):$PATH" \
      PYTHONPATH="$overlay:$ROOT:$dir:$work/utils" "$PY" "$ROOT/tools/plan_apps.py" "$a" )
    continue
  fi
  ( cd "$dir" && HOME="$work/home" PATH="$(dirname "$PY"):$PATH" POPXL_SIM_REPORT="$work/reports/$a" \
    PYTHONPATH="$overlay:$ROOT:$dir:$work/utils:$work/tutorials/utils" \
    timeout "${APP_TIMEOUT:-4800}" "$PY" -m pytest -q -p no:cacheprovider --continue-on-collection-errors -rfEs --tb=short --rootdir="$dir" $tests "$@" ) \
    >"$work/$a.out" 2>&1
  line=$(grep -E "[0-9]+ (passed|failed|errors?|skipped)" "$work/$a.out" | tail -1)
  [[ -z $line ]] && line="no pytest summary: past APP_TIMEOUT (${APP_TIMEOUT:-4800} s) or killed"
  grep -E "^(FAILED|ERROR|SKIPPED)" "$work/$a.out" | cut -c1-220
  echo "== $a: $line"
  [[ -n ${KEEP_LOGS:-} ]] && cp "$work/$a.out" "$KEEP_LOGS/$a.out"
  # the end-to-end runs' scripts (the tests start them) report their Sessions' estimates
  rep="$work/reports/$a/sim_report.txt"
  [[ -f $rep ]] && awk '/^== Session/ { keep = $0 ~ /\((inference|finetuning|pretraining|run_|mnist)/ }
    keep && /^(== Session|  IPU|Time per run)/' "$rep" | cut -c1-220
  [[ -n ${KEEP_LOGS:-} && -f $rep ]] && cp "$rep" "$KEEP_LOGS/$a.sim_report.txt"
done
