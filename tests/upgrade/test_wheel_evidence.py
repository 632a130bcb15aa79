"""The scanner's rules against what the wheels hold (`data/07-upgrading/evidence.json`) and the installed torch.

The JSON is written by `python -m pt215.upgrade.evidence` from the torch 2.13/2.14 wheels and the CUDA 12 NCCL and
cuDNN wheels (read, never installed); the installed torch's side is re-read here live.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pt215.book_files import data_path
from pt215.upgrade import scan_text
from pt215.upgrade.evidence import build_stub_nccl, import_torch, installed_facts, load_torch_cuda
from pt215.upgrade.rules import NEW_IN_215, RPATH_FOLDERS, RULES

EVIDENCE = json.loads(data_path("07-upgrading/evidence.json").read_text())
HAS_TOOLS = shutil.which("readelf") is not None and shutil.which("nm") is not None


def test_pt1509_counts_exactly_the_apis_214_lacks():
    installed = EVIDENCE["installed"]
    new = {n for n, has in installed["apis"].items() if has and not any(o["apis"][n] for o in EVIDENCE["older"])}
    assert NEW_IN_215 == new
    assert "2.14.0" in {o["version"] for o in EVIDENCE["older"]}


def test_the_installed_side_is_current():
    live = installed_facts()
    assert live["version"] == EVIDENCE["installed"]["version"] and live["apis"] == EVIDENCE["installed"]["apis"]
    assert live["tensor_properties_pickle"] == EVIDENCE["installed"]["tensor_properties_pickle"]
    if HAS_TOOLS and "libtorch_cuda_rpath" in live:
        assert live["libtorch_cuda_rpath"] == EVIDENCE["installed"]["libtorch_cuda_rpath"]
        assert live["nccl_imports"] == EVIDENCE["installed"]["nccl_imports"]


def test_pt1507_the_fields_written_and_read():
    assert EVIDENCE["installed"]["tensor_properties_pickle"] == {"writes": 6, "reads": [5, 6]}
    old = next(o for o in EVIDENCE["older"] if o["version"] == "2.14.0")
    assert old["tensor_properties_pickle"] == {"writes": 5, "reads": [5]}
    assert "6 fields" in RULES["PT1507"].fix and "unpacks 5" in RULES["PT1507"].fix


def test_pt1508_and_pt1517_their_release_facts():
    old = next(o for o in EVIDENCE["older"] if o["version"] == "2.14.0")
    assert (EVIDENCE["installed"]["requires_python"], old["requires_python"]) == (">=3.11", ">=3.10")
    assert (EVIDENCE["installed"]["use_nccl2_switch"], old["use_nccl2_switch"]) == ('=="0"', '=="1"')


def test_the_rpath_folders_and_strong_nccl_imports():
    rpath = EVIDENCE["installed"]["libtorch_cuda_rpath"]
    assert rpath[0] == "RPATH", "DT_RPATH (not RUNPATH): searched before LD_LIBRARY_PATH"
    assert tuple(p for p in rpath[1:] if p.startswith("nvidia/")) == RPATH_FOLDERS
    imports = EVIDENCE["installed"]["nccl_imports"]
    assert all(s.startswith("U ") for s in imports), "every NCCL entry point is a strong import: no gate at load"
    for name in ("ncclCommShrink", "ncclCommRevoke", "ncclCommGrow", "ncclCommSuspend", "ncclCommWindowRegister"):
        assert f"U {name}" in imports


def test_pt1513_cu12_wheels_write_into_the_rpath_folders():
    nccl, cudnn = EVIDENCE["nccl_cu12"], EVIDENCE["cudnn_cu12"]
    assert nccl["in_rpath_folders"] == ["nvidia/nccl/lib/libnccl.so.2"]
    assert all(f.startswith("nvidia/cudnn/lib/") for f in cudnn["in_rpath_folders"]) and cudnn["in_rpath_folders"]
    missing = nccl["missing_entry_points"]
    assert len(missing) == 16 and "ncclCommResume" in missing
    assert nccl["import_torch_with_it_preloaded"].endswith("undefined symbol: ncclCommResume")
    (f,) = [x for x in scan_text("pip install nvidia-nccl-cu12==2.27.3\n", "s.sh") if x.code == "PT1513"]
    assert f"lacks {len(missing)}, e.g. ncclCommResume" in f.fix


def test_macos_15_for_mps_is_in_the_215_mac_wheel():
    assert "The MPS backend is supported on macOS 15.0+. " in EVIDENCE["mac_215"]["macos_strings"]


needs_linux_cuda_wheel = pytest.mark.skipif(
    not sys.platform.startswith("linux") or shutil.which("cc") is None
    or "libtorch_cuda_rpath" not in EVIDENCE["installed"], reason="needs Linux, a C compiler and the CUDA wheel")


@needs_linux_cuda_wheel
def test_ld_library_path_does_not_replace_the_wheels_nccl_but_ld_preload_does(tmp_path):
    stub = build_stub_nccl(tmp_path / "other")
    plain = load_torch_cuda({"LD_LIBRARY_PATH": str(stub.parent)})
    assert plain == {"mapped": ["nvidia/nccl/lib/libnccl.so.2"], "error": None}
    preloaded = load_torch_cuda({"LD_PRELOAD": str(stub)})
    assert preloaded["mapped"] == ["<other>/libnccl.so.2"] and preloaded["error"].startswith("undefined symbol: nccl")


@needs_linux_cuda_wheel
def test_an_older_nccl_fails_at_load_instead_of_falling_under_a_gate(tmp_path):
    have = [s.split()[1] for s in EVIDENCE["installed"]["nccl_imports"]]
    older = [s for s in have if s not in EVIDENCE["nccl_cu12"]["missing_entry_points"]]  # what 2.27.3 exports
    stub = build_stub_nccl(tmp_path / "nccl-2.27", older)
    res = load_torch_cuda({"LD_PRELOAD": str(stub)})
    assert res["error"] == "undefined symbol: ncclCommResume"


@needs_linux_cuda_wheel
def test_import_torch_preloads_an_nccl_from_sys_path_before_the_rpath(tmp_path):
    """torch/__init__.py preloads nvidia/nccl/lib/libnccl.so.* from the first sys.path entry that has one, ahead of
    libtorch_cuda.so's DT_RPATH; LD_LIBRARY_PATH still loses."""
    have = [s.split()[1] for s in EVIDENCE["installed"]["nccl_imports"]]
    stub = build_stub_nccl(tmp_path / "pp" / "nvidia" / "nccl" / "lib", have, version_code=23105)
    via_path = import_torch({"PYTHONPATH": str(tmp_path / "pp")})
    assert via_path == {"mapped": ["<other>/libnccl.so.2"], "error": None, "bound_version": 23105}
    plain = import_torch({"LD_LIBRARY_PATH": str(stub.parent)})
    assert plain["mapped"] == ["nvidia/nccl/lib/libnccl.so.2"] and plain["bound_version"] == 23007


@needs_linux_cuda_wheel
def test_torch_cuda_nccl_version_is_the_build_not_the_library_loaded(tmp_path):
    """With another NCCL preloaded, torch.cuda.nccl.version() still says 2.30.7 (compile time); the library's own
    ncclGetVersion, which the `nccl version` check reads, says 2.31.5, and the check warns."""
    have = [s.split()[1] for s in EVIDENCE["installed"]["nccl_imports"]]
    stub = build_stub_nccl(tmp_path / "other", have, version_code=23105)
    code = ("import json, torch\nfrom pt215.upgrade import environment as e\n"
            "c = next(c for c in e.environment_checks({}) if c.name == 'nccl version')\n"
            "print(json.dumps([list(torch.cuda.nccl.version()), list(e.probe_nccl_loaded()), c.verdict]))")
    env = {**os.environ, "LD_PRELOAD": str(stub)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600,
                         check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == [[2, 30, 7], [2, 31, 5], "warn"]


def test_the_evidence_file_names_its_command():
    assert EVIDENCE["command"].startswith("python -m pt215.upgrade.evidence --old-wheel torch-2.14.0")
    assert Path(data_path("07-upgrading/evidence.json")).stat().st_size < 100_000
