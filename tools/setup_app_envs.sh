#!/usr/bin/env bash
# Make the dependency overlays tools/run_apps.sh puts on PYTHONPATH for Graphcore's PopXL apps,
# outside the project, with `pip install --target` (torch and numpy come from PYTHON's venv).
#
# Usage: tools/setup_app_envs.sh EXAMPLES_UTILS_GIT_DIR [CLIP_GIT_DIR]
#   PYTHON (default .venv/bin/python), VENVS (default /work/venvs)
# EXAMPLES_UTILS_GIT_DIR: a git dir of github:graphcore/examples-utils; CLIP_GIT_DIR: of
# github:openai/CLIP (MAGMA compares with clip.model; it also needs magma, not installed here).
set -eu
EU=${1:?usage: tools/setup_app_envs.sh EXAMPLES_UTILS_GIT_DIR [CLIP_GIT_DIR]}
PY=${PYTHON:-.venv/bin/python}; VENVS=${VENVS:-/work/venvs}
pip_to() { local dir=$1; shift; "$PY" -m pip install -q --no-deps --target "$VENVS/$dir" "$@"; }
pip_to tf418 transformers==4.18.0
pip_to tf4251 transformers==4.25.1
pip_to tf431 transformers==4.31.0
# transformers 4.18 checks tokenizers < 0.13 at import, which has no Python 3.11 wheel; no test
# that runs offline tokenizes, so the pin is relaxed in this overlay only
sed -i 's|"tokenizers>=0.11.1,!=0.11.3,<0.13"|"tokenizers>=0.11.1,!=0.11.3"|' \
  "$VENVS/tf418/transformers/dependency_versions_table.py"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
git --git-dir="$EU" archive HEAD | tar -x -C "$tmp"
pip_to common huggingface_hub==0.16.4 tokenizers==0.13.3 simple-parsing==0.0.19.post1 \
  docstring-parser typing_extensions requests urllib3 idna charset_normalizer certifi \
  more-itertools scipy cppimport mako markupsafe pybind11 psutil tfrecord sacremoses click \
  joblib ftfy wcwidth "$tmp"
if [[ -n ${2:-} ]]; then
  mkdir "$tmp/clip" && git --git-dir="$2" archive HEAD | tar -x -C "$tmp/clip"
  pip_to common "$tmp/clip"
fi
# wandb 0.18 (numpy 2) with its own dependencies; those the main venv has are removed
"$PY" -m pip install -q --target "$VENVS/wandb" wandb==0.18.7
for d in "$VENVS"/wandb/*; do
  n=$(basename "$d"); n=${n%%-*}; n=${n%.py}
  "$PY" -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('$n') is None)" \
    2>/dev/null </dev/null && [[ $n != wandb ]] && rm -rf "$d"
done
echo "overlays ready in $VENVS"
