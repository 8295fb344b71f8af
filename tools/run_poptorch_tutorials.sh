#!/usr/bin/env bash
# Run Graphcore's PopTorch tutorials (graphcore/examples) unchanged through `python -m popxl_fx.compat`,
# with their own tests.
#
# Usage, from the project root:
#   tools/run_poptorch_tutorials.sh EXAMPLES_GIT_DIR [TUTORIAL...] [-- PYTEST_ARGS...]
#   EXAMPLES_GIT_DIR: a git dir of github:graphcore/examples (e.g. /work/.mirror/graphcore+examples/repo)
#   TUTORIAL: basics mixed_precision efficient_data_loading (default: all three; the others need
#   MNIST, CIFAR-10 or downloads, which this machine does not have)
# Environment: PYTHON (default .venv/bin/python); VENVS (default /work/venvs), holding an overlay
# made with `pip install --target $VENVS/tutorials scikit-learn nbformat nbconvert ipykernel`;
# FASHION_MNIST (default /usr/share/datasets/fashion-mnist, Debian's dataset-fashion-mnist).
# The tutorials' tests start `python`/`python3 SCRIPT`: both resolve to `$PYTHON -m popxl_fx.compat`
# here, so `import poptorch` is this project's. HOME is a temporary folder, where the tutorials'
# `~/.torch/datasets` gets Fashion-MNIST's files, so torchvision finds them and downloads nothing.
set -u
GITDIR=${1:?usage: tools/run_poptorch_tutorials.sh EXAMPLES_GIT_DIR [TUTORIAL...] [-- PYTEST_ARGS...]}
shift
NAMES=(); while [[ $# -gt 0 && $1 != -- ]]; do NAMES+=("$1"); shift; done; [[ ${1:-} == -- ]] && shift
[[ ${#NAMES[@]} == 0 ]] && NAMES=(basics mixed_precision efficient_data_loading)
ROOT=$PWD; PY=${PYTHON:-.venv/bin/python}; [[ $PY == /* ]] || PY=$ROOT/$PY; VENVS=${VENVS:-/work/venvs}
DATA=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
git --git-dir="$GITDIR" ls-tree -r HEAD tutorials/utils \
  $(for n in "${NAMES[@]}"; do echo "tutorials/tutorials/pytorch/$n"; done) | while read -r _ _ sha path; do
  mkdir -p "$work/$(dirname "$path")"
  git --git-dir="$GITDIR" cat-file blob "$sha" >"$work/$path" 2>/dev/null || rm -f "$work/$path"
done
# torchvision's FashionMNIST looks for the unpacked IDX files under ROOT/FashionMNIST/raw
raw="$work/home/.torch/datasets/FashionMNIST/raw"; mkdir -p "$raw"
for f in "$DATA"/*-ubyte.gz; do gunzip -c "$f" >"$raw/$(basename "$f" .gz)"; done
mkdir -p "$work/bin"
for name in python python3; do
  printf '#!/bin/sh\nexec "%s" -m popxl_fx.compat "$@"\n' "$PY" >"$work/bin/$name"
  chmod +x "$work/bin/$name"
done
for n in "${NAMES[@]}"; do
  dir="$work/tutorials/tutorials/pytorch/$n"
  ( cd "$dir" && HOME="$work/home" PATH="$work/bin:$PATH" MPLBACKEND=Agg \
    PYTHONPATH="$ROOT:$work/tutorials/utils:$VENVS/tutorials" \
    timeout 3000 "$PY" -m pytest -q -p no:cacheprovider -rfEs --tb=short --rootdir="$dir" tests "$@" ) \
    >"$work/$n.out" 2>&1
  line=$(grep -E "[0-9]+ (passed|failed|errors?|skipped)" "$work/$n.out" | tail -1)
  grep -E "^(FAILED|ERROR|SKIPPED)" "$work/$n.out" | cut -c1-220
  echo "== $n: $line"
  [[ -n ${KEEP_LOGS:-} ]] && cp "$work/$n.out" "$KEEP_LOGS/$n.out"
done
