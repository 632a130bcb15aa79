"""The hub image recipe (`scripts/hub/Dockerfile`, "Hub sizing"): the notebooks' pins only, torch's CPU wheel by
default, nothing that breaks gloo in a pod. Checked as text: building it needs a container engine and the network."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "scripts" / "hub" / "Dockerfile"


def instructions() -> list[str]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_installs_the_participant_set_with_the_cpu_wheel_by_default():
    lines = instructions()
    assert "ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu" in lines
    run = " ".join(line for line in lines if line.startswith("RUN"))
    assert "-r requirements-participant.txt -e ." in run and '--index-url "$TORCH_INDEX"' in run
    assert "requirements.txt" not in run.replace("requirements-participant.txt", "")  # not the maintainer's set
    assert not re.search(r"jupyter-book|sphinx|pytest|playwright|npm", run)


def test_guards_the_python_version_and_keeps_gloo_free_to_choose_its_interface():
    lines = instructions()
    assert any("sys.version_info >= (3, 11)" in line for line in lines)
    assert not any("GLOO_SOCKET_IFNAME" in line for line in lines)
    assert any(line.startswith("ENV OMP_NUM_THREADS=") for line in lines)


def test_build_context_leaves_the_local_environment_out():
    ignored = (DOCKERFILE.parent / "Dockerfile.dockerignore").read_text().split()
    assert {".venv", "_build", "_vendor"} <= set(ignored)
