"""The participant install (`scripts/install.sh`, "Install and run"): its pins, its Python guard, and what it
asks pip to do, checked with a stub interpreter (no network, nothing installed)."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "install.sh"
TOOLCHAIN = {"jupyter-book", "sphinx", "myst-nb", "myst-parser", "pytest", "pytest-xdist", "execnet", "nbval",
             "playwright", "ruff", "sphinx-book-theme", "pydata-sphinx-theme", "jupyter-cache", "jupytext"}

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def pins(path: Path) -> dict[str, str]:
    """name -> the rest of the line (version and marker), for every pinned requirement."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.match(r"([A-Za-z0-9_.-]+)\s*==\s*(.+)", line)
        if m:
            out[m.group(1).lower()] = re.sub(r"\s+", "", m.group(2))
    return out


def test_participant_pins_are_the_books_notebook_pins():
    part, book = pins(ROOT / "requirements-participant.txt"), pins(ROOT / "requirements.txt")
    assert {"torch", "numpy", "jupyterlab", "ipykernel", "psutil", "torchao", "nixl"} <= set(part)
    assert all(book.get(name) == spec for name, spec in part.items()), {n: (s, book.get(n)) for n, s in part.items()}
    assert not TOOLCHAIN & set(part), "the participant set has no website or test toolchain"


STUB = """#!/usr/bin/env bash
# A stand-in for python: reports VERSION, records every call, makes venvs of itself.
echo "$0 $*" >> "$STUB_LOG"
case "$1" in
  -c) case "$2" in *version_info*) echo "$STUB_VERSION" ;; *) echo "torch 2.15.0+cpu" ;; esac ;;
  -m) if [ "$2" = venv ]; then mkdir -p "$3/bin"; cp "$0" "$3/bin/python"; fi ;;
esac
exit 0
"""


@pytest.fixture
def stub(tmp_path: Path):
    exe = tmp_path / "bin" / "python3.x"
    exe.parent.mkdir()
    exe.write_text(STUB)
    exe.chmod(0o755)
    log = tmp_path / "calls.log"

    def install(*args: str, version: str = "3.11.9") -> tuple[subprocess.CompletedProcess, list[str]]:
        env = {**os.environ, "STUB_LOG": str(log), "STUB_VERSION": version}
        env.pop("PYTHON", None)
        proc = subprocess.run(["bash", str(SCRIPT), "--python", str(exe), "--venv", str(tmp_path / "v"), *args],
                              capture_output=True, text=True, env=env, timeout=60)
        calls = log.read_text().splitlines() if log.exists() else []
        return proc, [c.replace(str(tmp_path), "TMP") for c in calls]

    return install


def test_old_python_stops_with_a_clear_message(stub):
    proc, calls = stub(version="3.9.6")
    assert proc.returncode == 2
    assert "is Python 3.9.6; the book needs Python >= 3.11" in proc.stderr
    assert "No matching distribution found for torch==2.15.0" in proc.stderr and "--python python3.12" in proc.stderr
    assert not any("pip" in c or "venv" in c for c in calls)  # nothing was installed


@pytest.mark.skipif(platform.system() != "Linux", reason="--cpu changes the torch index on Linux only")
def test_cpu_choice_installs_torch_from_the_cpu_index_first(stub):
    proc, calls = stub("--cpu")
    assert proc.returncode == 0, proc.stderr
    pip = [c.split(" -m pip install ", 1)[1] for c in calls if " -m pip install " in c]
    assert calls[1] == "TMP/bin/python3.x -m venv TMP/v"
    assert pip == ["--quiet --upgrade pip", "torch==2.15.0 --index-url https://download.pytorch.org/whl/cpu",
                   "-r requirements-participant.txt -e ."]
    assert all(c.startswith("TMP/v/bin/python") for c in calls if " -m pip " in c)  # into the venv
    assert "install.sh: done (torch 2.15.0+cpu)" in proc.stdout


def test_default_install_takes_torch_from_pypi(stub):
    proc, calls = stub()
    assert proc.returncode == 0, proc.stderr
    assert not any("--index-url" in c for c in calls)
    assert calls[-2].endswith("-m pip install -r requirements-participant.txt -e .")


def test_dry_run_prints_the_commands_and_runs_none(stub):
    proc, calls = stub("--cpu", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert len(calls) == 1 and "version_info" in calls[0]  # only the version guard ran
    printed = [line for line in proc.stdout.splitlines() if line.startswith("+ ")]
    assert printed[0].endswith(" -m venv " + printed[0].rsplit(" ", 1)[-1]) and len(printed) == 4
    assert "dry run, nothing installed" in proc.stdout


def test_bad_arguments_are_named(stub):
    proc, _ = stub("--gpu")
    assert proc.returncode == 2 and "unknown option '--gpu'" in proc.stderr
    proc = subprocess.run(["bash", str(SCRIPT), "--python", "python3.0-does-not-exist"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "no Python interpreter 'python3.0-does-not-exist' found" in proc.stderr


def test_here_needs_an_active_environment(stub):
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX")}
    proc = subprocess.run(["bash", str(SCRIPT), "--here"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2 and "activate a conda environment or a venv first" in proc.stderr


def test_uv_without_uv_says_how_to_get_it(tmp_path):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for tool in ("dirname", "grep", "head", "sed"):
        (bin_ / tool).symlink_to(shutil.which(tool))
    proc = subprocess.run([shutil.which("bash"), str(SCRIPT), "--uv"], capture_output=True, text=True, timeout=60,
                          env={"PATH": str(bin_), "HOME": str(tmp_path)})
    assert proc.returncode == 2 and "--uv: uv is not installed" in proc.stderr


def test_setup_sh_stays_the_maintainers_path():
    text = (ROOT / "scripts" / "setup.sh").read_text()
    assert "-r requirements.txt" in text and "vendor_js.sh" in text


def test_jupyterlab_is_installed():
    out = subprocess.run([sys.executable, "-m", "jupyterlab", "--version"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip()[:1].isdigit(), out.stderr


def _pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, rest = line.split("==", 1)
            out[name.strip().lower()] = rest.strip()
    return out


def test_binder_environment_matches_the_book_pins():
    binder, book = _pins(ROOT / ".binder/requirements.txt"), _pins(ROOT / "requirements.txt")
    assert binder and all(book.get(name) == version for name, version in binder.items()), (binder, book)
    assert (ROOT / ".binder/runtime.txt").read_text().strip() == "python-3.11"
    assert "jupyter-book" not in binder and "pytest" not in binder  # notebooks only, not the toolchain
