"""One home per concept (CONTRIBUTING.md): what must not be written a second time outside its module."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CODE = sorted([*ROOT.glob("src/pt215/**/*.py"), *ROOT.glob("chapters/*/*.py"), *ROOT.glob("chapters/*/*.md"),
               *ROOT.glob("scripts/*.py")])

# pattern: (its one home, what it is)
HOMES = {
    r"\bperf_counter\b": ("src/pt215/timing.py", "the clock"),
    r"def _?sync\(": ("src/pt215/timing.py", "a device sync"),
    r"def \w*copy_bandwidth\(|def memcpy_\w+\(": ("src/pt215/roofline.py", "copy bandwidth"),
    r"def \w*tokens_per_s\(|def measure_decode\(": ("src/pt215/roofline.py", "decode tokens/s"),
    r"def init_dist\(|def _init\(": ("src/pt215/launch.py", "joining a job"),
    r"\.index_add_\(": ("src/pt215/moe.py", "mixing the experts' outputs"),
    r"nvidia-smi\b[\"']|which\(\"nvidia-smi": ("src/pt215/hardware.py", "running nvidia-smi"),
}


@pytest.mark.parametrize("pattern", HOMES)
def test_concept_lives_in_its_home(pattern: str):
    home, what = HOMES[pattern]
    elsewhere = [f"{p.relative_to(ROOT)}:{i}" for p in CODE if p.relative_to(ROOT).as_posix() != home
                 for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if re.search(pattern, line)]
    assert not elsewhere, f"{what} is written outside {home}: {elsewhere}"
