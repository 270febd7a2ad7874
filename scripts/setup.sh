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
touch "$VENV/.installed"
