#!/usr/bin/env bash
# Create the virtual environment in which the real AttnLRP (lxt 2.1) runs as a peer.
#
# lxt 2.1 does not import under transformers 5, so it gets its own environment with
# transformers 4.53.2 and the same CPU torch as ours. Idempotent: an existing, complete
# environment is left as it is (pass --force to rebuild it). It ships inside the package, next
# to the worker that the environment runs (attnlrp_worker.py); the line to run it, with this
# file's installed path, is captum_ffb.evaluation.peers.SETUP_COMMAND (and the error of
# `captum-ffb evaluate --methods attnlrp` names it). From a checkout:
#
#   bash captum_ffb/evaluation/peers/setup_lxt.sh     # default: $HOME/.cache/captum_ffb/lxt-venv
#   CAPTUM_FFB_LXT_VENV=/some/dir bash captum_ffb/evaluation/peers/setup_lxt.sh
set -euo pipefail

VENV="${CAPTUM_FFB_LXT_VENV:-$HOME/.cache/captum_ffb/lxt-venv}"
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="2.13.0"
TRANSFORMERS_VERSION="4.53.2"
LXT_VERSION="2.1"
STAMP="$VENV/.captum_ffb_lxt_ok"
WANT="torch==$TORCH_VERSION transformers==$TRANSFORMERS_VERSION lxt==$LXT_VERSION gguf==0.19.0 zennit==0.5.1 no-torchvision"

if [[ "${1:-}" == "--force" ]]; then
    rm -rf "$VENV"
elif [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" && -x "$VENV/bin/python" ]]; then
    echo "lxt peer environment ready: $VENV/bin/python"
    exit 0
fi

export PIP_DISABLE_PIP_VERSION_CHECK=1
if [[ ! -x "$VENV/bin/python" ]]; then
    mkdir -p "$(dirname "$VENV")"
    "$PYTHON" -m venv "$VENV"
fi
pip_install() {
    # pip's notes about absent local index folders are noise here: drop them
    "$VENV/bin/python" -m pip install -q "$@" 2> >(grep -v "is ignored: it is neither" >&2)
}

# CPU torch first, on its own, so that nothing later pulls a CUDA build: the "+cpu" local version
# exists only as a CPU wheel (a local wheel folder, or PyTorch's CPU index as the fallback).
if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__ != '$TORCH_VERSION+cpu')" \
        2>/dev/null; then
    pip_install "torch==$TORCH_VERSION+cpu" 2>/dev/null \
        || pip_install "torch==$TORCH_VERSION+cpu" --index-url https://download.pytorch.org/whl/cpu
fi
pip_install "torch==$TORCH_VERSION+cpu" "transformers==$TRANSFORMERS_VERSION" \
    accelerate==1.15.0 tabulate==0.10.0 matplotlib==3.11.2 gguf==0.19.0 numpy==2.4.6 \
    click pillow
# zennit's own requirement torchvision would come from PyPI built for CUDA torch (its operators
# then fail to register on CPU torch, and transformers' Llama import fails with them): zennit and
# lxt (whose metadata pins older torch/transformers) go in without their dependencies; the
# worker (attnlrp_worker.py, next to this script) gives lxt's ViT patches a stand-in for
# torchvision.
pip_install --no-deps zennit==0.5.1 "lxt==$LXT_VERSION"
if "$VENV/bin/python" -m pip show -q torchvision >/dev/null 2>&1; then
    "$VENV/bin/python" -m pip uninstall -q -y torchvision
fi

# check that the pieces import (lxt itself needs stand-ins; the worker provides them)
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import importlib.util

import torch

assert torch.version.cuda is None, "the peer environment must use the CPU build of torch"
assert importlib.util.find_spec("torchvision") is None, "torchvision must not be installed here"
for name in ("torch", "transformers", "lxt", "zennit", "gguf", "numpy"):
    print(f"  {name} {md.version(name)}")
PY
echo "$WANT" > "$STAMP"
echo "lxt peer environment ready: $VENV/bin/python"
