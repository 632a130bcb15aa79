"""pt215.hardware: the machine report and the cell gates (chapter 0)."""

from __future__ import annotations

import dataclasses
import io

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
