"""`python -m pt215.doctor` (Running a workshop): each failure line under a faked environment, and one real run."""

from __future__ import annotations

import json

import pytest

from pt215 import doctor
from pt215.checks import Check

GOOD_LAUNCH = {"results": {0: {"sum": 1.0, "world": 2}, 1: {"sum": 1.0, "world": 2}}, "left": 0}


@pytest.fixture(scope="module")
def real_launch() -> dict:
    """The real 2-rank gloo job, run once for the whole module (a few seconds)."""
    return doctor.probe_launch()


@pytest.fixture
def healthy(monkeypatch):
    """A healthy CPU machine: every probe faked, so each test changes one thing."""
    monkeypatch.setattr(doctor, "probe_torch", lambda: doctor.Torch("2.15.0+cu132", cuda="13.2", nccl="2.30.7",
                                                                     cudnn="9.26.0"))
    monkeypatch.setattr(doctor, "probe_driver", lambda: (None, None))
    monkeypatch.setattr(doctor, "probe_package", lambda name: "1.0")
    monkeypatch.setattr(doctor, "probe_kernels", lambda: [("python3", True)])
    monkeypatch.setattr(doctor, "probe_memory", lambda: (16.0, 12.0))
    monkeypatch.setattr(doctor, "probe_disk", lambda: 50.0)
    monkeypatch.setattr(doctor, "probe_data", lambda: [])
    monkeypatch.setattr(doctor, "probe_launch", lambda: GOOD_LAUNCH)
    return monkeypatch


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def test_healthy_cpu_machine_passes(healthy, capsys):
    assert doctor.main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) >= 11 and lines[-1].endswith("ready for the CPU track")
    assert not any(line.startswith("[fail]") for line in lines)


def test_missing_nixl_is_a_warning_with_its_fix(healthy, capsys):
    healthy.setattr(doctor, "probe_package", lambda name: None if name == "nixl" else "1.0")
    assert doctor.main([]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("[warn] nixl"))
    assert "chapter 3" in line and "-> pip install -r requirements.txt" in line


def test_wrong_torch_fails(healthy, capsys):
    healthy.setattr(doctor, "probe_torch", lambda: doctor.Torch("2.14.1+cu130", cuda="13.0"))
    assert doctor.main([]) == 1
    out = capsys.readouterr().out
    assert "[fail] torch: 2.14.1+cu130 (CUDA 13.0 wheel); the book needs 2.15.0 -> pip install torch==2.15.0" in out
    assert "cannot follow the CPU track" in out.splitlines()[-1]


def test_torch_not_importable_fails_and_skips_the_launch(healthy):
    healthy.setattr(doctor, "probe_torch", lambda: doctor.Torch(None))
    checks = by_name(doctor.collect())
    assert checks["torch"].verdict == "fail"
    assert checks["2-rank gloo job"].verdict == "skip"


def test_no_jupyter_kernel_fails(healthy, capsys):
    healthy.setattr(doctor, "probe_kernels", lambda: [])
    assert doctor.main([]) == 1
    line = next(line for line in capsys.readouterr().out.splitlines() if "Jupyter kernel" in line)
    assert line.startswith("[fail] Jupyter kernel: no Python kernelspec found -> python -m ipykernel install")


def test_kernel_without_torch_fails_naming_it(healthy):
    healthy.setattr(doctor, "probe_kernels", lambda: [("python3", False)])
    c = by_name(doctor.collect())["Jupyter kernel"]
    assert c.verdict == "fail" and "python3" in c.detail


@pytest.mark.parametrize("free, verdict", [(0.5, "fail"), (3.0, "warn"), (20.0, "ok")])
def test_disk(healthy, free, verdict):
    healthy.setattr(doctor, "probe_disk", lambda: free)
    assert by_name(doctor.collect())["disk"].verdict == verdict


@pytest.mark.parametrize("mem, verdict", [((2.0, 1.5), "fail"), ((16.0, 2.0), "warn"), ((16.0, 12.0), "ok")])
def test_memory(healthy, mem, verdict):
    healthy.setattr(doctor, "probe_memory", lambda: mem)
    assert by_name(doctor.collect())["memory"].verdict == verdict


def test_missing_data_fails_naming_the_file(healthy):
    healthy.setattr(doctor, "probe_data", lambda: ["05-nvfp4-decoding/lm-dense.pt"])
    c = by_name(doctor.collect())["book data"]
    assert c.verdict == "fail" and "lm-dense.pt" in c.detail and c.fix


def test_failed_or_leaky_launch_fails(healthy):
    healthy.setattr(doctor, "probe_launch", lambda: {"error": "rank 1 of x.py failed (exit code 1)", "left": 0})
    assert by_name(doctor.collect())["2-rank gloo job"].line().startswith("[fail] 2-rank gloo job: pt215.launch.run")
    healthy.setattr(doctor, "probe_launch", lambda: {**GOOD_LAUNCH, "left": 2})
    assert "2 process(es) left behind" in by_name(doctor.collect())["2-rank gloo job"].detail


@pytest.mark.parametrize("wheel, driver, verdict", [
    (None, None, "skip"), ("13.2", None, "skip"), ("13.2", (13, 4), "ok"), ("13.4", (13, 2), "warn"),
    ("13.2", (12, 8), "warn"),
])
def test_driver_against_wheel(wheel, driver, verdict):
    assert doctor.check_driver(wheel, driver, "580.1", n_gpus=0 if driver is None else 1).verdict == verdict


def test_gpu_tracks_and_mps():
    assert doctor.check_gpus([]).verdict == "skip"
    assert "one-GPU track" in doctor.check_gpus([("H100", "sm_90", 80.0)]).detail
    assert ">= 2 GPU track" in doctor.check_gpus([("H100", "sm_90", 80.0)] * 2).detail
    assert doctor.check_mps("Darwin", "15.3", True, True).verdict == "ok"
    assert doctor.check_mps("Darwin", "14.6", True, True).verdict == "warn"
    assert doctor.check_mps("Linux", None, False, False).verdict == "skip"
    assert doctor.wheel_kind(None, None, True) == "MPS" and doctor.wheel_kind(None, None, False) == "CPU"


def test_python_version():
    assert doctor.check_python((3, 10, 12)).verdict == "fail"
    assert doctor.check_python((3, 12, 1)).verdict == "ok"


def test_json_report(healthy, capsys):
    healthy.setattr(doctor, "probe_package", lambda name: None if name == "nixl" else "1.0")
    assert doctor.main(["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["exit_code"] == 0 and data["counts"]["warn"] >= 1
    assert {"host", "python", "torch"} <= set(data["machine"])
    assert {c["name"] for c in data["checks"]} >= {"Python", "torch", "nixl", "Jupyter kernel", "2-rank gloo job"}


def test_upgrade_without_the_module_says_so(healthy, capsys):
    healthy.setattr(doctor, "_upgrade_checks", lambda: None)
    assert doctor.main(["--upgrade"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pt215.upgrade_checks" in err[0]


def test_upgrade_appends_its_checks(healthy, capsys):
    healthy.setattr(doctor, "_upgrade_checks", lambda: lambda: [Check("upgrade: env", "warn", "x", fix="y")])
    assert doctor.main(["--upgrade"]) == 0
    assert "[warn] upgrade: env: x -> y" in capsys.readouterr().out


def test_real_launch_reports_back_and_leaves_nothing(real_launch):
    assert doctor.check_launch(real_launch).verdict == "ok", real_launch


def test_book_data_is_found_here():
    assert doctor.probe_data() == []


def test_missing_book_data_names_each_file_and_the_reason(monkeypatch):
    from pt215 import book_files

    def absent(relative):
        raise book_files.BookFilesError(f"no data/{relative}")

    monkeypatch.setattr(book_files, "data_path", absent)
    missing = doctor.probe_data()
    assert len(missing) == len(doctor.BOOK_DATA) and "(no data/" in missing[0]
    assert doctor.check_data(missing, "data/").verdict == "fail"


def test_upgrade_runs_the_upgrade_chapter_checks(healthy, capsys):
    pytest.importorskip("pt215.upgrade_checks")
    assert doctor.main(["--upgrade", "--no-launch"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("[ok] nccl backend:") for line in lines)
    assert lines[-1].endswith("ready for the CPU track")
