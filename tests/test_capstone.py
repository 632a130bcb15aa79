"""Chapter 11's job: both versions run small on gloo, the scanner finds the 2.14 habits and passes the upgrade."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from pt215 import ab
from pt215.launch import run
from pt215.verify.checks import AB_METRIC

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = ROOT / "chapters" / "11-capstone"
JOB, UPGRADED = CHAPTER / "job", CHAPTER / "job-2.15"
FILES = {"train.py", "comm_bytes.py", "launch.sh", "pyproject.toml", "Dockerfile", "README.md"}
QUIET = {"OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}


def scan(folder: Path, *args: str) -> tuple[int, list[dict]]:
    proc = subprocess.run([sys.executable, "-m", "pt215.upgrade", "--format", "json", *args, folder.name],
                          cwd=folder.parent, capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)["findings"]


def test_both_versions_hold_the_same_files():
    for folder in (JOB, UPGRADED):
        assert {p.name for p in folder.iterdir() if p.is_file()} == FILES, folder.name


def test_the_scanner_finds_each_2_14_habit_of_the_job():
    code, found = scan(JOB)
    codes = Counter(f["code"] for f in found)
    where = {(Path(f["path"]).name, f["code"]) for f in found}
    assert code == 1
    # legacy flight-recorder names, reduce_dtype unset, DCP saves, Python 3.10 (project and image), a CUDA 12 index
    assert codes["PT1501"] == 3 and {("launch.sh", "PT1501"), ("train.py", "PT1505"), ("train.py", "PT1507"),
                                     ("pyproject.toml", "PT1508"), ("Dockerfile", "PT1508"),
                                     ("Dockerfile", "PT1512")} <= where
    assert "PT1503" not in codes  # TORCH_DIST_USE_NCCL2 is unset in the 2.14 job, as the chapter says


def test_the_upgraded_job_scans_with_no_failing_finding():
    code, found = scan(UPGRADED)
    assert code == 0 and not [f for f in found if f["severity"] in ("error", "warning")], found


def test_fix_makes_only_the_mechanical_changes(tmp_path):
    shutil.copytree(JOB, tmp_path / "job")
    subprocess.run([sys.executable, "-m", "pt215.upgrade", "--fix", "job"], cwd=tmp_path, capture_output=True,
                   timeout=120)
    changed = {p.name for p in (tmp_path / "job").iterdir() if p.read_bytes() != (JOB / p.name).read_bytes()}
    assert changed == {"pyproject.toml", "train.py"}
    assert "reduce_dtype=torch.bfloat16" in (tmp_path / "job" / "train.py").read_text()
    _, left = scan(tmp_path / "job")
    assert {f["code"] for f in left} == {"PT1501", "PT1507", "PT1508", "PT1512"}


def _parse(folder: Path):
    sys.path.insert(0, str(folder))
    try:
        spec = importlib.util.spec_from_file_location(f"capstone_{folder.name.replace('.', '_').replace('-', '_')}",
                                                      folder / "train.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclass resolves its annotations through sys.modules
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop(spec.name, None)
    return module.parse


@pytest.mark.parametrize(("argv", "message"), [
    (["--steps", "0"], "--steps must be >= 1"),
    (["--samples", "0"], "--samples must be >= 1"),
    (["--hang-dump-after", "30", "--timeout", "20"], "--hang-dump-after must be >= 0 and below --timeout"),
    (["--reduce-dtype", "fp16"], "invalid choice: 'fp16'"),
])
def test_the_upgraded_job_refuses_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        _parse(UPGRADED)(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.slow
def test_the_2_14_job_runs_small_as_written(tmp_path):
    res = run(JOB / "train.py", 2, args=["--backend", "gloo", "--steps", "2", "--ckpt-every", "2", "--ckpt-dir",
                                         str(tmp_path / "ckpt"), "--comm-debug-step", "1", "--probe-every", "2"],
              env=QUIET, timeout=300, stream=False, show=False)
    out = res.stdout[0]
    assert out[-1].startswith("final loss ") and out[-1].endswith("after step 2 (2 steps per rank)"), out
    # 2.15 with reduce_dtype unset: the fp32 parameters' gradients are reduced in fp32 (78 496 x 4 bytes per rank)
    assert any("reduce_scatter_bytes 313984" in line for line in out), out
    # the book's counter (FSDP2's own calls wrapped) sees the same bytes as CommDebugMode (at the dispatcher)
    comm = next(re.search(AB_METRIC, line).groupdict() for line in out if "book_counter" in line)
    assert comm["ag_bytes"] == comm["ag_counter"] and comm["rs_bytes"] == comm["rs_counter"] == "313984", comm
    assert (tmp_path / "ckpt" / "step2" / ".metadata").is_file()


@pytest.mark.slow
def test_the_upgraded_job_runs_small_with_its_new_settings(tmp_path):
    arm = ab.Arm("2.15", {**ab.env_from_script(UPGRADED / "launch.sh"), **QUIET,
                          "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "rank_")},
                 ("--reduce-dtype", "bf16", "--keep-fp32", "router,norm", "--hang-dump-after", "60"), nproc=2)
    res = ab.run_arm(UPGRADED / "train.py", arm, job_args=["--backend", "gloo", "--steps", "2",
                                                           "--comm-debug-step", "1"], timeout=300)
    out = res.stdout[0]
    assert out[-1].endswith("after step 2 (2 steps per rank)"), out
    # bf16 gradients (2.14's bytes); the kept fp32 weights add 2 bytes per value of each shard they are gathered in
    assert any("all_gather_bytes 154176 reduce_scatter_bytes 156992" in line
               and "book_counter all_gather 154176 reduce_scatter 156992" in line for line in out), out
    assert not list(tmp_path.glob("rank_*"))  # a healthy run leaves no hang dump


def test_the_notebook_and_its_gpu_check_read_the_log_with_one_pattern():
    """11.2's METRIC (the CPU cells and the GPU cell) is the pattern `pt215.verify`'s ch11.ab-nccl check uses."""
    source = (CHAPTER / "11-2-ab.md").read_text()
    start = source.index("METRIC = (")
    end = source.index(")\n", start) + 1
    names: dict = {}
    exec(source[start:end], names)  # noqa: S102 - a literal assignment from the book's own notebook
    assert names["METRIC"] == AB_METRIC
    line = "comm step 2 all_gather_bytes 10 reduce_scatter_bytes 20 collectives 8 book_counter all_gather 10 " \
           "reduce_scatter 20"
    assert re.search(AB_METRIC, line).groupdict() == {"step_ms": None, "ag_bytes": "10", "rs_bytes": "20",
                                                      "ag_counter": "10", "rs_counter": "20", "flips": None,
                                                      "loss": None}
