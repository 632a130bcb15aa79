"""`python -m pt215.doctor` (Running a workshop): each failure line under a faked environment, and one real run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from pt215 import doctor
from pt215.upgrade.environment import Check

GOOD_LAUNCH = {"results": {r: {"sum": 6.0, "world": 4} for r in range(4)}, "left": 0}
REAL_PROBE_LAUNCH = doctor.probe_launch


@pytest.fixture(scope="module")
def real_launch() -> dict:
    """The real 4-rank gloo job, run once for the whole module (a few seconds)."""
    return doctor.probe_launch()


@pytest.fixture
def healthy(monkeypatch):
    """A healthy CPU machine: every probe faked, so each test changes one thing."""
    monkeypatch.setattr(doctor, "probe_torch", lambda: doctor.Torch("2.15.0+cu132", cuda="13.2", nccl="2.30.7",
                                                                     cudnn="9.26.0"))
    monkeypatch.setattr(doctor, "probe_driver", lambda: (None, None))
    monkeypatch.setattr(doctor, "probe_package", lambda name: "1.0")
    monkeypatch.setattr(doctor, "probe_kernels", lambda: [("python3", None)])
    monkeypatch.setattr(doctor, "probe_memory", lambda: (16.0, 12.0))
    monkeypatch.setattr(doctor, "probe_disk", lambda: 50.0)
    monkeypatch.setattr(doctor, "probe_data", lambda: [])
    monkeypatch.setattr(doctor, "probe_launch", lambda: GOOD_LAUNCH)
    monkeypatch.setattr(doctor, "probe_fp8", lambda: None)
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
    assert "[fail] torch: torch 2.14.1+cu130; the book needs 2.15.0 -> pip install torch==2.15.0" in out
    assert "cannot follow the CPU track" in out.splitlines()[-1]


def test_torch_not_importable_fails_and_skips_the_launch(healthy):
    healthy.setattr(doctor, "probe_torch", lambda: doctor.Torch(None))
    checks = by_name(doctor.collect())
    assert checks["torch"].verdict == "fail"
    assert checks[doctor.LAUNCH].verdict == "skip"


def test_no_jupyter_kernel_fails(healthy, capsys):
    healthy.setattr(doctor, "probe_kernels", lambda: [])
    assert doctor.main([]) == 1
    line = next(line for line in capsys.readouterr().out.splitlines() if "Jupyter kernel" in line)
    assert line.startswith("[fail] Jupyter kernel: no Python kernelspec found -> python -m ipykernel install")


def test_kernel_without_torch_fails_naming_it_and_the_cause(healthy):
    cause = doctor.KernelProblem("python3 -c 'import torch, pt215' fails: ModuleNotFoundError: No module named 'torch'")
    healthy.setattr(doctor, "probe_kernels", lambda: [("python3", cause)])
    c = by_name(doctor.collect())["Jupyter kernel"]
    assert c.verdict == "fail" and "python3" in c.detail and "No module named 'torch'" in c.detail
    healthy.setattr(doctor, "probe_kernels", lambda: [("pt215", None), ("python3", cause)])
    assert by_name(doctor.collect())["Jupyter kernel"].verdict == "warn"


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
    healthy.setattr(doctor, "probe_launch", lambda: {"error": "rank 1 failed (exit code 1)",
                                                     "cause": "RuntimeError: boom", "left": 0})
    line = by_name(doctor.collect())[doctor.LAUNCH].line()
    assert line.startswith("[fail] 4-rank gloo job: rank 1 failed (exit code 1): RuntimeError: boom -> ")
    healthy.setattr(doctor, "probe_launch", lambda: {**GOOD_LAUNCH, "left": 2})
    assert "2 process(es) left behind" in by_name(doctor.collect())[doctor.LAUNCH].detail


def test_driver_is_probed_only_for_a_cuda_wheel(healthy):
    """The driver check is the upgrade checklist's (`upgrade.environment.check_driver`), fed by the doctor's probes."""
    healthy.setattr(doctor, "probe_driver", lambda: pytest.fail("a CPU wheel needs no driver probe"))
    healthy.setattr(doctor, "probe_torch", lambda: doctor.Torch("2.15.0", nccl="2.30.7"))
    assert by_name(doctor.collect())["driver"].verdict == "skip"
    gpu = doctor.Torch("2.15.0+cu132", cuda="13.2", devices=(("NVIDIA H200", "sm_90", 139.8),))
    healthy.setattr(doctor, "probe_torch", lambda: gpu)
    healthy.setattr(doctor, "probe_driver", lambda: ((13, 0), "580.65.06"))
    c = by_name(doctor.collect())["driver"]
    assert c.verdict == "warn" and "580.65.06" in c.detail and "minor-version compatibility" in c.detail


def test_gpu_tracks_and_mps():
    assert doctor.check_gpus([]).verdict == "skip"
    assert "one-GPU track" in doctor.check_gpus([("H100", "sm_90", 80.0)]).detail
    assert ">= 2 GPU track" in doctor.check_gpus([("H100", "sm_90", 80.0)] * 2).detail
    assert doctor.check_mps("Darwin", "15.3", True, True).verdict == "ok"
    assert doctor.check_mps("Darwin", "15.3", True, False).verdict == "warn"
    assert doctor.check_mps("Linux", None, False, False).verdict == "skip"


def test_the_summary_names_the_tracks_from_the_probes_not_the_text(healthy, capsys):
    two = doctor.Torch("2.15.0+cu132", cuda="13.2", devices=(("NVIDIA H200", "sm_90", 139.8),) * 2)
    healthy.setattr(doctor, "probe_torch", lambda: two)
    healthy.setattr(doctor, "probe_driver", lambda: ((13, 2), "580.95.05"))
    assert doctor.main(["--no-launch"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith("ready for the CPU track and the >= 2 GPU track")
    healthy.setattr(doctor, "probe_torch", lambda: doctor.Torch("2.15.0", mps_built=True, mps_available=True))
    healthy.setattr(doctor.platform, "system", lambda: "Darwin")
    for macos, tracks in (("15.3", " and the Apple Silicon track"), ("14.6", "")):
        healthy.setattr(doctor, "probe_macos", lambda v=macos: v)
        assert doctor.main(["--no-launch"]) == 0
        assert capsys.readouterr().out.splitlines()[-1].endswith("ready for the CPU track" + tracks)


def test_the_environment_checks_are_the_upgrade_checklists():
    from pt215.upgrade import environment

    for name in ("check_python", "check_torch", "check_wheel", "check_driver", "check_macos_mps"):
        assert not hasattr(doctor, name) or getattr(doctor, name) is getattr(environment, name), name


def test_json_report(healthy, capsys):
    healthy.setattr(doctor, "probe_package", lambda name: None if name == "nixl" else "1.0")
    assert doctor.main(["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["exit_code"] == 0 and data["counts"]["warn"] >= 1
    assert {"host", "python", "torch"} <= set(data["machine"])
    assert {c["name"] for c in data["checks"]} >= {"python", "torch", "wheel", "driver", "nixl", "Jupyter kernel",
                                                 doctor.LAUNCH, "FP8 on CPU"}


def test_upgrade_appends_the_checks_it_has_not_run(healthy, capsys):
    healthy.setattr(doctor, "environment_checks", lambda: [Check("python", "ok", "again"),
                                                           Check("upgrade: env", "warn", "x", fix="y")])
    assert doctor.main(["--upgrade"]) == 0
    out = capsys.readouterr().out
    assert "[warn] upgrade: env: x -> y" in out and "again" not in out
    assert sum(line.startswith("[ok] python:") for line in out.splitlines()) == 1


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
    pytest.importorskip("pt215.upgrade.environment")
    assert doctor.main(["--upgrade", "--no-launch"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("[ok] nccl backend:") for line in lines)
    assert lines[-1].endswith("ready for the CPU track")
    names = [line.split(":")[0] for line in lines[:-1]]
    assert len(names) == len(set(names)), "a check printed twice"


# ---------------------------------------------------------------- causes on the line (issue: the doctor that says why)


def test_missing_gloo_interface_fails_with_the_cause_on_the_line(healthy, capsys):
    """A hub image copied from a cluster sets GLOO_SOCKET_IFNAME to an interface the pod lacks."""
    healthy.setattr(doctor, "probe_launch", REAL_PROBE_LAUNCH)
    healthy.setenv("GLOO_SOCKET_IFNAME", "pt215nosuch0")
    assert doctor.main([]) == 1
    line = next(line for line in capsys.readouterr().out.splitlines() if "gloo job" in line)
    assert line.startswith("[fail] 4-rank gloo job: rank ")
    assert "Unable to find address for: pt215nosuch0" in line, line
    assert "-> GLOO_SOCKET_IFNAME=pt215nosuch0 names no network interface" in line


def test_failure_cause_picks_the_exception_line():
    tb = ["Traceback (most recent call last):", '  File "x.py", line 3, in <module>', "    f()",
          "RuntimeError: [enforce fail at /a/b/device.cc:84] ifa != nullptr. Unable to find address for: eth9", ""]
    assert doctor.failure_cause(tb) == "RuntimeError: ifa != nullptr. Unable to find address for: eth9"
    assert doctor.failure_cause(["waiting", "still waiting", ""]) == "waiting | still waiting"
    assert doctor.failure_cause([]) == "(no output)"


def _kernelspec(folder, name: str, python: str) -> None:
    spec = folder / "kernels" / name
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": name, "language": "python"}))


def test_kernelspec_with_a_missing_interpreter_fails_the_check(tmp_path, monkeypatch):
    pytest.importorskip("jupyter_client")
    _kernelspec(tmp_path, "gone", str(tmp_path / "deleted-venv" / "bin" / "python"))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    kernels = dict(doctor.probe_kernels())
    assert "does not exist" in kernels["gone"].cause and not kernels["gone"].starts
    c = doctor.check_kernel(list(kernels.items()))
    assert c.verdict == "fail" and "gone: its interpreter" in c.detail and "jupyter kernelspec remove" in c.fix


def test_kernel_check_starts_the_kernels_own_interpreter(tmp_path):
    """The kernel's interpreter really imports torch: a Python without torch is named with its error."""
    sys_python = shutil.which("python3", path="/usr/bin:/bin")
    if sys_python is None:
        pytest.skip("no system python3")
    cause = doctor.kernel_problem([sys_python, "-m", "ipykernel_launcher"], env={"PYTHONPATH": str(tmp_path)})
    assert cause is not None and "No module named" in cause.cause and cause.starts
    assert doctor.kernel_problem(["python3", "-m", "ipykernel_launcher"]) is None  # the doctor's own Python


def test_broken_torch_import_names_its_error_and_no_kernel_claims_torch(tmp_path):
    """A torch that is installed but fails to import: the torch line and the kernel line both say why."""
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise OSError('libtorch_cpu.so: cannot open shared object file')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    out = subprocess.run([sys.executable, "-m", "pt215.doctor", "--no-launch"], capture_output=True, text=True,
                         env=env, timeout=300).stdout.splitlines()
    torch_line = next(line for line in out if line.startswith("[fail] torch:"))
    assert "OSError: libtorch_cpu.so: cannot open shared object file" in torch_line
    kernel_line = next(line for line in out if "Jupyter kernel" in line)
    assert not kernel_line.startswith("[ok]") and "libtorch_cpu.so" in kernel_line


# ---------------------------------------------------------------- limits of a pod, FP8


def _files(root, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_cgroup_v2_limits(tmp_path):
    _files(tmp_path, {"cgroup.controllers": "cpu memory", "memory.max": "max", "cpu.max": "max 100000",
                      "user/pod/memory.max": str(4 * 2**30), "user/pod/memory.current": str(2**30),
                      "user/pod/memory.stat": f"anon 1\ninactive_file {2**28}\n", "user/pod/cpu.max": "150000 100000",
                      "user/memory.max": str(8 * 2**30)})
    cg = doctor.read_cgroup("0::/user/pod\n", tmp_path)
    assert cg == doctor.Cgroup(4 * 2**30, 2**30 - 2**28, 1.5)
    assert doctor.read_cgroup("0::/\n", tmp_path) == doctor.Cgroup(None, None, None)


def test_cgroup_v1_limits_inside_a_container(tmp_path):
    # the host's path of the group does not exist inside the container: the mount's root is the group
    _files(tmp_path, {"memory/memory.limit_in_bytes": str(6 * 2**30), "memory/memory.usage_in_bytes": "1000",
                      "cpu,cpuacct/cpu.cfs_quota_us": "200000", "cpu,cpuacct/cpu.cfs_period_us": "100000"})
    cg = doctor.read_cgroup("4:memory:/kubepods/pod1/abc\n2:cpu,cpuacct:/kubepods/pod1/abc\n", tmp_path)
    assert cg == doctor.Cgroup(6 * 2**30, 1000, 2.0)
    _files(tmp_path / "nolimit", {"memory/memory.limit_in_bytes": "9223372036854771712",
                                  "cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"})
    assert doctor.read_cgroup("4:memory:/\n1:cpu:/\n", tmp_path / "nolimit").memory_max is None


def test_pod_limits_replace_the_hosts():
    gib = 2**30
    cg = doctor.Cgroup(memory_max=3 * gib, memory_used=gib, cpus=1.0)
    total, avail, by = doctor.effective_memory(64.0 * gib, 50.0 * gib, cg)
    assert (total / gib, avail / gib, by) == (3.0, 2.0, "cgroup limit")
    assert doctor.check_memory(total / gib, avail / gib, by).verdict == "fail"
    assert "cgroup limit" in doctor.check_memory(total / gib, avail / gib, by).detail
    assert doctor.effective_memory(8.0 * gib, 6.0 * gib, doctor.Cgroup()) == (8.0 * gib, 6.0 * gib, "")
    assert doctor.effective_cores(64, 64, cg) == (1.0, "cgroup CPU quota")
    assert doctor.effective_cores(64, 4, doctor.Cgroup()) == (4, "CPU affinity")
    assert doctor.check_cores(1.0, "cgroup CPU quota").line().startswith("[warn] CPU cores: 1 (cgroup CPU quota)")


def test_fp8_warning_when_the_cpu_has_no_fp8_kernel(healthy):
    healthy.setattr(doctor, "probe_fp8", lambda: "oneDNN has no FP8 matmul for this CPU (AVX2 only)")
    c = by_name(doctor.collect())["FP8 on CPU"]
    assert c.verdict == "warn" and "AVX2 only" in c.detail and "6.1" in c.detail and c.fix
    assert doctor.check_fp8(None).verdict == "ok"


def test_fp8_probe_is_the_fp8_modules():
    from pt215 import fp8

    assert doctor.probe_fp8() == fp8.cpu_fp8_matmul_problem()


def test_cxx_check_says_what_is_missing_and_what_to_do():
    from pt215 import doctor

    assert doctor.check_cxx((True, "")).verdict == "ok"
    none = doctor.check_cxx(None)
    assert none.verdict == "warn" and "no C++ compiler" in none.detail and "g++" in none.fix
    old = doctor.check_cxx((False, "c10/util/Bitset.h:42:1: error: 'countr_zero' is not a member of 'std'"))
    assert old.verdict == "warn" and "countr_zero" in old.detail and "C++20" in old.fix


def test_fp8_warning_says_what_still_runs():
    from pt215 import doctor

    c = doctor.check_fp8("torch._scaled_mm fails on this CPU's kernels (AVX2): could not create a primitive")
    assert c.verdict == "warn" and "reference path" in c.detail and "only tensorwise torch._scaled_mm" in c.detail
    assert "F.scaled_mm" in c.detail
