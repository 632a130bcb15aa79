#!/usr/bin/env bash
# The participant install ("Install and run"): only what the notebooks need, into a virtual environment.
#
#   bash scripts/install.sh            # Linux or macOS: .venv with requirements-participant.txt and pt215
#   bash scripts/install.sh --cpu      # Linux: torch from the PyTorch CPU wheel index (no CUDA libraries)
#   bash scripts/install.sh --uv       # the same through uv (uv venv, uv pip install)
#   bash scripts/install.sh --here     # into the active environment (a conda env), no .venv
#   bash scripts/install.sh --dry-run  # print the commands, run nothing
#
# Options: --python PY (the interpreter for the venv; default $PYTHON or python3), --venv DIR (default .venv).
# Windows: run it inside WSL2 (Ubuntu), as on Linux. The maintainer's install (website and test tools, npm,
# chromium) is scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

CPU_INDEX="https://download.pytorch.org/whl/cpu"
TORCH_PIN=$(grep -E '^torch==' requirements-participant.txt | head -n1)
PY=${PYTHON:-python3}
VENV=.venv
CPU=0 UV=0 HERE=0 DRY=0 PY_SET=0

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "install.sh: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) CPU=1 ;;
    --uv) UV=1 ;;
    --here) HERE=1 ;;
    --dry-run) DRY=1 ;;
    --python) [ $# -ge 2 ] || die "--python needs an interpreter (python3.12, /usr/bin/python3.11, ...)"; PY=$2; PY_SET=1; shift ;;
    --python=*) PY=${1#*=}; PY_SET=1 ;;
    --venv) [ $# -ge 2 ] || die "--venv needs a folder"; VENV=$2; shift ;;
    --venv=*) VENV=${1#*=} ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown option '$1'; expected --cpu, --uv, --here, --dry-run, --python PY, --venv DIR (see --help)" ;;
  esac
  shift
done
[ -n "$VENV" ] || die "--venv needs a folder"

run() {  # print a command; run it unless --dry-run
  echo "+ $*"
  if [ "$DRY" = 0 ]; then "$@"; fi
}

# ---- the Python guard: torch 2.15.0 has wheels for Python >= 3.11 only
if [ "$HERE" = 1 ]; then
  [ -n "${CONDA_PREFIX:-}${VIRTUAL_ENV:-}" ] \
    || die "--here installs into the active environment: activate a conda environment or a venv first"
  [ "$PY_SET" = 1 ] || PY=${PYTHON:-python}
fi
if [ "$UV" = 1 ]; then
  command -v uv >/dev/null 2>&1 || die "--uv: uv is not installed (pip install uv, or https://docs.astral.sh/uv/)"
  if ! FOUND=$(uv python find "$PY" 2>/dev/null); then
    run uv python install "$PY"   # uv downloads a managed Python when the machine has none of that version
    FOUND=$(uv python find "$PY" 2>/dev/null) || die "--uv: uv has no Python '$PY' (uv python install $PY failed)"
  fi
  PY=$FOUND
fi
command -v "$PY" >/dev/null 2>&1 || die "no Python interpreter '$PY' found. Install Python 3.11 or 3.12 and pass it with --python (see chapters/00-before-you-start/install.md)"
VERSION=$("$PY" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null) \
  || die "'$PY' did not run; pass a working Python 3.11 or 3.12 with --python"
MAJOR=${VERSION%%.*}; REST=${VERSION#*.}; MINOR=${REST%%.*}
if [ "$MAJOR" -lt 3 ] || { [ "$MAJOR" -eq 3 ] && [ "$MINOR" -lt 11 ]; }; then
  cat >&2 <<EOF
install.sh: '$PY' is Python $VERSION; the book needs Python >= 3.11 (torch 2.15.0 has no wheels for $MAJOR.$MINOR,
so pip would stop at "No matching distribution found for torch==2.15.0").
Install Python 3.12 and re-run with it:
  macOS:   brew install python@3.12           then: bash scripts/install.sh --python python3.12
  Ubuntu:  sudo apt install python3.12-venv   then: bash scripts/install.sh --python python3.12
  uv:      uv python install 3.12             then: bash scripts/install.sh --uv --python 3.12
  conda:   conda create -n pt215 python=3.12 && conda activate pt215   then: bash scripts/install.sh --here
EOF
  exit 2
fi
if [ "$MAJOR" -eq 3 ] && [ "$MINOR" -gt 12 ]; then
  echo "install.sh: Python $VERSION: the pins are checked for 3.11 and 3.12; continuing" >&2
fi

OS=$(uname -s)
if [ "$CPU" = 1 ] && [ "$OS" = Darwin ]; then
  echo "install.sh: --cpu has no effect on macOS: PyPI's torch wheel for macOS is already the CPU (and MPS) build" >&2
  CPU=0
fi

# ---- the environment
if [ "$UV" = 1 ]; then
  if [ "$HERE" = 1 ]; then
    TARGET=(--python "$PY")
  else
    [ -x "$VENV/bin/python" ] || run uv venv --python "$PY" "$VENV"
    TARGET=(--python "$VENV/bin/python")
  fi
  PIP=(uv pip install "${TARGET[@]}")
  VPY=${TARGET[1]}
else
  if [ "$HERE" = 1 ]; then
    VPY=$PY
  else
    [ -x "$VENV/bin/python" ] || run "$PY" -m venv "$VENV"
    VPY=$VENV/bin/python
  fi
  PIP=("$VPY" -m pip install)
  run "${PIP[@]}" --quiet --upgrade pip
fi

# ---- torch first from the CPU index (--cpu), then everything else from PyPI; torch==2.15.0 is then satisfied
if [ "$CPU" = 1 ]; then
  run "${PIP[@]}" "$TORCH_PIN" --index-url "$CPU_INDEX"
fi
run "${PIP[@]}" -r requirements-participant.txt -e .

if [ "$DRY" = 1 ]; then
  echo "install.sh: dry run, nothing installed"
  exit 0
fi
echo "install.sh: done ($("$VPY" -c 'import torch; print("torch", torch.__version__)'))"
echo "next: $VPY -m pt215.doctor    then: $VPY -m jupyter lab chapters/"
