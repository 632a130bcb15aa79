#!/usr/bin/env bash
# Install everything the book needs into .venv (README command 1, first half):
#   - Python packages pinned in requirements.txt, and the helper package pt215 (editable)
#   - MathJax, require.js and the Jupyter widget manager from the npm registry into _vendor/ (site works offline)
#   - Debian's chromium for the browser test, when running as root and it is missing
# Safe to re-run: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -r requirements.txt -e .
bash scripts/vendor_js.sh
if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
  else
    echo "setup: the browser test needs Debian's chromium at /usr/bin/chromium (sudo apt-get install chromium)" >&2
  fi
fi
echo "setup: done ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
