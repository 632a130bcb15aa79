"""Every `torch.`-dotted name in the chapters' text and code, and in `pt215`'s source, resolves in the installed torch.

Names a chapter mentions precisely because they do not exist are listed, with the reason, in that chapter's
`absent-names.txt` (one `torch.x.y  # why` per line); those `pt215` writes without their resolving here, in
`SRC_ABSENT` below.
"""

from __future__ import annotations

import importlib
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"(?<![\w.])torch(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
FILES = (sorted(p for p in (ROOT / "chapters").rglob("*") if p.suffix in {".md", ".py"}) + [ROOT / "intro.md"]
         + sorted((ROOT / "src" / "pt215").rglob("*.py")))
SRC_ABSENT = {
    "torch.cuda._get_device_properties": "set by torch.cuda's lazy init on a machine with a GPU; "
                                         "pt215.inductor_code's simulated GPU provides it",
    "torch.distributed.init_process_group.enable_reconfigure": "a keyword argument, named in the scanner's text",
}


@cache
def resolves(name: str) -> bool:
    parts = name.split(".")
    obj = None
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        rest = parts[i:]
        break
    else:
        return False
    for attr in rest:
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            return False
    return True


def allowlist(chapter: Path) -> set[str]:
    f = chapter / "absent-names.txt"
    if not f.is_file():
        return set()
    return {line.split("#")[0].strip() for line in f.read_text().splitlines() if line.split("#")[0].strip()}


def names_in(path: Path) -> set[str]:
    return set(NAME.findall(path.read_text(encoding="utf-8")))


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES])
def test_torch_names_resolve(path: Path):
    allowed = (allowlist(path.parent) if path.parent.parent.name == "chapters"
               else set(SRC_ABSENT) if ROOT / "src" in path.parents else set())
    bad = sorted(n for n in names_in(path) if n not in allowed and not resolves(n))
    assert not bad, f"names that do not exist in torch {importlib.import_module('torch').__version__}: {bad}"


def test_allowlisted_names_really_are_absent():
    for chapter in sorted((ROOT / "chapters").iterdir()):
        for name in allowlist(chapter):
            assert not resolves(name), f"{chapter.name}/absent-names.txt lists {name}, which exists"
    for name in SRC_ABSENT:
        assert not resolves(name), f"SRC_ABSENT lists {name}, which exists"


# 2.15 names chapters 1-2 teach (debug server, health and recorder hooks, windows, the estimator, version check):
# each must stay mentioned in a chapter and resolve, so a rename in torch fails here by name.
TAUGHT_2_15 = [
    "torch.distributed.debug.start_debug_server",
    "torch.distributed.debug.stop_debug_server",
    "torch.distributed.debug._frontend.fetch_all",
    "torch._C._distributed_c10d.HealthCheckHook",
    "torch._C._distributed_c10d.FlightRecorderHook",
    "torch._C._distributed_c10d._WorkerServer",
    "torch._C._distributed_c10d.ProcessGroupNCCL2",
    "torch._C._distributed_c10d.Window",
    "torch.distributed._new_window",
    "torch.distributed._supports_window",
    "torch.distributed._time_estimator",
    "torch.distributed.shrink_group",
    "torch.distributed._reconfigure",
    "torch.cuda.nccl.version",
]
CHAPTERS_1_3 = {"01-collectives-nccl2", "02-flight-recorder", "03-nixl-transfers"}


@pytest.mark.parametrize("name", TAUGHT_2_15)
def test_taught_2_15_names_resolve_and_are_taught(name: str):
    assert resolves(name), f"{name} no longer exists in torch {importlib.import_module('torch').__version__}"
    short = name.rsplit(".", 1)[-1]
    assert any(short in p.read_text(encoding="utf-8") for p in FILES if p.parent.name in CHAPTERS_1_3), (
        f"{name} is no longer taught in chapters 1-3")


def test_the_checker_catches_a_made_up_name():
    assert resolves("torch.distributed.all_reduce")
    assert resolves("torch.nn.functional.scaled_mm")
    assert not resolves("torch.distributed.enable_flight_recorder")
