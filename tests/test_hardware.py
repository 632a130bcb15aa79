"""pt215.hardware: the machine report and the cell gates (chapter 0)."""

from __future__ import annotations

import dataclasses
import io
import re

import pytest
import torch

from pt215.hardware import CudaDevice, HardwareReport, check, report, requires


def fake(**kw) -> HardwareReport:
    base = dict(python="3.11.7", torch="2.15.0", torch_cuda="13.2", platform="Linux", machine="x86_64",
                cpu_cores=2)
    base.update(kw)
    return HardwareReport(**base)


H200 = CudaDevice(0, "NVIDIA H200", (9, 0), 139.8)
B200 = CudaDevice(1, "NVIDIA B200", (10, 0), 179.0)
B300 = CudaDevice(0, "NVIDIA B300", (10, 3), 268.0)
RTX5090 = CudaDevice(0, "NVIDIA GeForce RTX 5090", (12, 0), 31.4)


def test_report_describes_this_machine():
    hw = report()
    assert hw.torch == torch.__version__
    assert hw.cpu_cores >= 1
    assert len(hw.cuda_devices) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    text = str(hw)
    for key in ("Python", "torch", "CPU cores", "NCCL", "cuDNN", "MPS", "macOS", "nixl", "torchao"):
        assert key in text
    assert dataclasses.asdict(hw) == hw.as_dict()


def test_device_names():
    assert H200.sm == "sm_90" and H200.family == "Hopper"
    assert B200.sm == "sm_100" and B200.family == "Blackwell"


@pytest.mark.parametrize(
    ("devices", "need", "met"),
    [
        ((), "cuda", False),
        ((H200,), "cuda", True),
        ((H200,), "cuda>=2", False),
        ((H200, B200), "cuda>=2", True),
        ((H200,), "sm_90", True),
        ((H200,), "sm_100", False),
        ((H200, B200), "sm_100", True),
        ((RTX5090,), "sm_100", False),  # sm_120 lacks the sm_10x kernels (tcgen05, cuDNN SM100 attention)
        ((RTX5090,), "sm_90", True),
        ((B300,), "sm_100", True),
        ((B200,), "sm_90", True),
    ],
)
def test_cuda_gates(devices, need, met):
    assert (check(need, hw=fake(cuda_devices=devices)) == []) is met


@pytest.mark.parametrize(
    ("macos", "mps", "needs", "missing"),
    [
        (None, False, ("mps", "macos>=15"), ["mps", "macos>=15"]),
        ("14.6", True, ("mps", "macos>=15"), ["macos>=15"]),
        ("15.1", True, ("mps", "macos>=15"), []),
        ("26.0", True, ("macos>=15",), []),
    ],
)
def test_mps_gates(macos, mps, needs, missing):
    assert check(*needs, hw=fake(macos=macos, mps_available=mps, mps_built=mps)) == missing


def test_requires_prints_one_clear_line():
    out = io.StringIO()
    ok = requires("cuda>=2", shows="busbw for nccl", hw=fake(), file=out)
    assert ok is False
    line = out.getvalue()
    assert line.count("\n") == 1
    assert ">= 2 CUDA GPUs" in line and "no CUDA GPU" in line and "busbw for nccl" in line


def test_requires_proceeds_silently_when_met():
    out = io.StringIO()
    assert requires("nixl", "torchao", shows="x", hw=fake(nixl=True, torchao=True), file=out)
    assert out.getvalue() == ""


@pytest.mark.parametrize("bad", ["gpu", "cuda>=two", "sm90", "", "MPS"])
def test_unknown_need_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="unknown requirement"):
        check(bad, hw=fake())


def test_requires_needs_shows():
    with pytest.raises(ValueError, match="shows"):
        requires("cuda", shows="", hw=fake())


def test_sm100_gate_names_the_family():
    out = io.StringIO()
    assert requires("sm_100", shows="NVFP4", hw=fake(cuda_devices=(RTX5090,)), file=out) is False
    assert "sm_10x family" in out.getvalue() and "sm_120" in out.getvalue()


# ---------------------------------------------------------------- the one machine probe: nvidia-smi, the driver


def _smi(monkeypatch, *, exe: str | None = "/usr/bin/nvidia-smi", stdout: str = "", returncode: int = 0,
         raises: BaseException | None = None) -> list[list[str]]:
    """Fake `nvidia-smi`: where `shutil.which` finds it, and what running it gives; returns the commands run."""
    import subprocess

    from pt215 import hardware

    ran: list[list[str]] = []

    def run(cmd, **kw):
        ran.append(list(cmd))
        if raises is not None:
            raise raises
        return subprocess.CompletedProcess(cmd, returncode, stdout=stdout, stderr="")

    monkeypatch.setattr(hardware.shutil, "which", lambda name: exe if name == "nvidia-smi" else None)
    monkeypatch.setattr(hardware.subprocess, "run", run)
    return ran


def test_nvidia_smi_absent_failing_or_timing_out_is_none(monkeypatch):
    import subprocess

    from pt215.hardware import nvidia_smi

    ran = _smi(monkeypatch, exe=None)
    assert nvidia_smi(["-L"]) is None and ran == []  # absent: nothing is run
    _smi(monkeypatch, stdout="partial", returncode=9)
    assert nvidia_smi(["-L"]) is None
    _smi(monkeypatch, raises=subprocess.TimeoutExpired("nvidia-smi", 1.0))
    assert nvidia_smi(["-L"], timeout=1.0) is None
    _smi(monkeypatch, raises=PermissionError(13, "denied"))
    assert nvidia_smi(["-L"]) is None


def test_nvidia_smi_returns_its_output(monkeypatch):
    from pt215.hardware import nvidia_smi

    ran = _smi(monkeypatch, stdout="GPU 0: NVIDIA H200 (UUID: GPU-1)\n")
    assert nvidia_smi(["-L"]) == "GPU 0: NVIDIA H200 (UUID: GPU-1)\n"
    assert ran == [["/usr/bin/nvidia-smi", "-L"]]


def test_driver_version_from_proc_then_nvidia_smi(monkeypatch, tmp_path):
    from pt215.hardware import driver_version

    proc = tmp_path / "version"
    proc.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U)"
                    "\nGCC version:  gcc version 12.3.0\n")
    ran = _smi(monkeypatch, stdout="575.57.08\n575.57.08\n")
    assert driver_version(proc) == "580.95.05" and ran == []  # the kernel module's file comes first
    proc.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.133.20  Fri Mar 14 2025\n")
    assert driver_version(proc) == "570.133.20"
    assert driver_version(tmp_path / "absent") == "575.57.08"  # one line per GPU: the first
    assert ran == [["/usr/bin/nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]]
    _smi(monkeypatch, stdout="")
    assert driver_version(tmp_path / "absent") is None
    _smi(monkeypatch, exe=None)
    assert driver_version(tmp_path / "absent") is None


def test_driver_cuda_and_nccl_versions_on_this_machine():
    from pt215.hardware import driver_cuda_version, nccl_version

    v = driver_cuda_version()
    assert (v is None or v >= (12, 0)) and (v is not None or not torch.cuda.is_available())
    n = nccl_version()
    assert n is None or (len(n) == 3 and n >= (2, 0, 0))


def test_nvidia_smi_and_libcuda_are_asked_from_hardware_only():
    """One machine probe (issue: "The house a maintainer can live in"): no other module runs nvidia-smi, reads the
    driver's /proc file or calls libcuda."""
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "src" / "pt215"
    probe = re.compile(r'which\(\s*"nvidia-smi"|\[\s*"nvidia-smi"|cuDriverGetVersion|/proc/driver/nvidia')
    elsewhere = [f"{p.relative_to(src)}:{i}" for p in sorted(src.rglob("*.py")) if p.name != "hardware.py"
                 for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if probe.search(line)]
    assert not elsewhere, f"the machine is probed outside pt215.hardware: {elsewhere}"


def test_free_threaded_is_a_need_this_gil_python_lacks():
    import sysconfig

    assert report().free_threaded is (sysconfig.get_config_var("Py_GIL_DISABLED") == 1)
    assert check("free-threaded", hw=fake(free_threaded=True)) == []
    assert check("free-threaded", hw=fake()) == ["free-threaded"]
    buf = io.StringIO()
    assert not requires("free-threaded", shows="the GIL state", hw=fake(), file=buf)
    assert "needs a free-threaded Python" in buf.getvalue()
    assert "this machine has a Python with the GIL" in buf.getvalue()


def test_unmet_is_the_one_skip_sentence():
    from pt215 import hardware

    assert hardware.unmet("free-threaded", hw=fake(free_threaded=True)) is None
    assert hardware.unmet("cuda>=2", "nccl", hw=fake()) == (
        "needs >= 2 CUDA GPUs and NCCL with a CUDA GPU; this machine has no CUDA GPU")
