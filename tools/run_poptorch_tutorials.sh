#!/usr/bin/env bash
# Run Graphcore's PopTorch tutorials (graphcore/examples) unchanged through `python -m popxl_fx.compat`,
# with their own tests.
#
# Usage, from the project root:
#   tools/run_poptorch_tutorials.sh EXAMPLES_GIT_DIR [TUTORIAL...] [-- PYTEST_ARGS...]
#   EXAMPLES_GIT_DIR: a git dir of github:graphcore/examples (e.g. /work/.mirror/graphcore+examples/repo)
#   TUTORIAL: a folder under tutorials/tutorials/pytorch (basics, mixed_precision,
#   efficient_data_loading, pipelining, observing_tensors) or under
#   tutorials/simple_applications/pytorch (mnist); default: basics mixed_precision
#   efficient_data_loading pipelining mnist (bert needs a pretrained download)
# Environment: PYTHON (default .venv/bin/python); VENVS (default /work/venvs), holding an overlay
# made with `pip install --target $VENVS/tutorials scikit-learn nbformat nbconvert ipykernel`;
# FASHION_MNIST (default /usr/share/datasets/fashion-mnist, Debian's dataset-fashion-mnist);
# MNIST (default $VENVS/mnist/MNIST, the IDX files tools/setup_app_envs.sh unpacks).
# The tutorials' tests start `python`/`python3 SCRIPT`: both resolve to `$PYTHON -m popxl_fx.compat`
# here, so `import poptorch` is this project's. HOME is a temporary folder, where the tutorials'
# `~/.torch/datasets` gets Fashion-MNIST's and MNIST's files, so torchvision finds them and
# downloads nothing.
# OMP_NUM_THREADS defaults to 1: on a machine whose cores other processes share, torch's OpenMP
# threads spin waiting for each other (a small conv's step was 20x slower with 2 threads on a
# loaded 2-core machine, eager torch and the simulator alike).
set -u
GITDIR=${1:?usage: tools/run_poptorch_tutorials.sh EXAMPLES_GIT_DIR [TUTORIAL...] [-- PYTEST_ARGS...]}
shift
NAMES=(); while [[ $# -gt 0 && $1 != -- ]]; do NAMES+=("$1"); shift; done; [[ ${1:-} == -- ]] && shift
[[ ${#NAMES[@]} == 0 ]] && NAMES=(basics mixed_precision efficient_data_loading pipelining mnist)
ROOT=$PWD; PY=${PYTHON:-.venv/bin/python}; [[ $PY == /* ]] || PY=$ROOT/$PY; VENVS=${VENVS:-/work/venvs}
DATA=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}; MNIST=${MNIST:-$VENVS/mnist/MNIST}
# a tutorial's folder: the first of these that the examples repository has
folder() {
  for d in tutorials/tutorials/pytorch tutorials/simple_applications/pytorch; do
    [[ -n $(git --git-dir="$GITDIR" ls-tree HEAD "$d/$1") ]] && { echo "$d/$1"; return; }
  done
  echo "no tutorial named $1" >&2
}
declare -A DIRS; for n in "${NAMES[@]}"; do DIRS[$n]=$(folder "$n"); done
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
git --git-dir="$GITDIR" ls-tree -r HEAD tutorials/utils "${DIRS[@]}" | while read -r _ _ sha path; do
  mkdir -p "$work/$(dirname "$path")"
  git --git-dir="$GITDIR" cat-file blob "$sha" >"$work/$path" 2>/dev/null || rm -f "$work/$path"
done
# torchvision's FashionMNIST looks for the unpacked IDX files under ROOT/FashionMNIST/raw
raw="$work/home/.torch/datasets/FashionMNIST/raw"; mkdir -p "$raw"
for f in "$DATA"/*-ubyte.gz; do gunzip -c "$f" >"$raw/$(basename "$f" .gz)"; done
# MNIST's under ROOT/MNIST/raw: the overlay's are unpacked already
ln -s "$MNIST" "$work/home/.torch/datasets/MNIST"
mkdir -p "$work/bin"
for name in python python3; do
  printf '#!/bin/sh\nexec "%s" -m popxl_fx.compat "$@"\n' "$PY" >"$work/bin/$name"
  chmod +x "$work/bin/$name"
done
# the tests' own modules may import the tutorial (pipelining's `from mnist_pipeline import
# accuracy`): pytest's process gets the PYTHONPATH of the processes the hook starts
hooked=$(cd "$ROOT" && PYTHONPATH="$ROOT" "$PY" -c 'from popxl_fx.compat import child_env
print(child_env({})["PYTHONPATH"])')
for n in "${NAMES[@]}"; do
  [[ -z ${DIRS[$n]} ]] && { echo "== $n: not in $GITDIR"; continue; }
  dir="$work/${DIRS[$n]}"; tests=tests; [[ -d $dir/tests ]] || tests=.
  ( cd "$dir" && HOME="$work/home" PATH="$work/bin:$PATH" MPLBACKEND=Agg \
    OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} \
    PYTHONPATH="$hooked:$work/tutorials/utils:$VENVS/tutorials" \
    timeout 3000 "$PY" -m pytest -q -p no:cacheprovider -rfEs --tb=short --rootdir="$dir" $tests "$@" ) \
    >"$work/$n.out" 2>&1
  line=$(grep -E "[0-9]+ (passed|failed|errors?|skipped)" "$work/$n.out" | tail -1)
  grep -E "^(FAILED|ERROR|SKIPPED)" "$work/$n.out" | cut -c1-220
  echo "== $n: $line"
  [[ -n ${KEEP_LOGS:-} ]] && cp "$work/$n.out" "$KEEP_LOGS/$n.out"
done
