"""What this machine has, and gates for cells that need more.

Used by every chapter (see chapter 0, "Before you start"): `report()` describes the machine in one call;
`requires(...)` lets a cell state what it needs and either proceed or print one clear line.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from pt215.needs import describe_need, parse_need, sm_admits, version_tuple

__all__ = ["CudaDevice", "HardwareReport", "report", "requires", "check", "sm_admits", "summary", "nvidia_smi",
           "driver_version", "driver_cuda_version", "nccl_version", "describe_need", "unmet"]


@dataclass(frozen=True)
class CudaDevice:
    """One CUDA device: index, name, compute capability and memory."""

    index: int
    name: str
    capability: tuple[int, int]
    memory_gib: float

    @property
    def sm(self) -> str:
        """`sm_90` style name of the compute capability."""
        return f"sm_{self.capability[0]}{self.capability[1]}"

    @property
    def family(self) -> str:
        """Marketing family for the capabilities the book cares about."""
        major = self.capability[0]
        if major >= 10:
            return "Blackwell"
        if major == 9:
            return "Hopper"
        if self.capability == (8, 9):
            return "Ada"
        if major == 8:
            return "Ampere"
        return "older"


@dataclass(frozen=True)
class HardwareReport:
    """Everything a chapter's gates look at, gathered once by `report()`."""

    python: str
    torch: str
    torch_cuda: str | None
    platform: str
    machine: str
    cpu_cores: int
    cuda_devices: tuple[CudaDevice, ...] = field(default_factory=tuple)
    nccl: str | None = None
    cudnn: str | None = None
    mps_built: bool = False
    mps_available: bool = False
    macos: str | None = None
    nixl: bool = False
    torchao: bool = False
    free_threaded: bool = False

    def as_dict(self) -> dict:
        """Plain-dict view (JSON-serialisable)."""
        return asdict(self)

    def short(self) -> str:
        """One-line description, e.g. `CPU x86_64, 2 cores, no CUDA GPU`."""
        if self.cuda_devices:
            names = sorted({f"{d.name} ({d.sm})" for d in self.cuda_devices})
            gpus = f"{len(self.cuda_devices)}x " + ", ".join(names)
        else:
            gpus = "no CUDA GPU"
        extra = ""
        if self.mps_available:
            extra = f", MPS on macOS {self.macos}"
        return f"CPU {self.machine}, {self.cpu_cores} cores, {gpus}{extra}"

    def __str__(self) -> str:
        rows = [
            ("Python", self.python),
            ("torch", self.torch + (f" (CUDA {self.torch_cuda} build)" if self.torch_cuda else " (CPU build)")),
            ("platform", f"{self.platform} {self.machine}"),
            ("CPU cores", str(self.cpu_cores)),
        ]
        if self.cuda_devices:
            for d in self.cuda_devices:
                rows.append(
                    (f"cuda:{d.index}", f"{d.name}, {d.sm} ({d.family}), {d.memory_gib:.0f} GiB")
                )
        else:
            rows.append(("CUDA devices", "none"))
        rows += [
            ("NCCL", self.nccl or "not available"),
            ("cuDNN", self.cudnn or "not available"),
            ("MPS", "available" if self.mps_available else ("built, not available" if self.mps_built else "not built")),
            ("macOS", self.macos or "not macOS"),
            ("nixl", "importable" if self.nixl else "not installed"),
            ("torchao", "importable" if self.torchao else "not installed"),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def nccl_version() -> tuple[int, ...] | None:
    """The NCCL version torch was built against (`(2, 30, 7)`: `torch.cuda.nccl.version()` is compiled in, not read
    from the library loaded; chapter 7 compares the two), or None in a build without NCCL (chapter 1)."""
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - any failure means "not available"
        return None
    return tuple(v) if isinstance(v, tuple) else None


def _nccl_version() -> str | None:
    v = nccl_version()
    if v is None:
        return None
    # The CUDA wheel bundles NCCL even on a CPU-only machine; report it as bundled.
    return ".".join(map(str, v)) + ("" if torch.cuda.is_available() else " (bundled, no GPU)")


def _cudnn_version() -> str | None:
    try:
        v = torch.backends.cudnn.version()
    except Exception:  # noqa: BLE001
        return None
    if not v:
        return None
    major, minor, patch = v // 10000, (v // 100) % 100, v % 100
    text = f"{major}.{minor}.{patch}"
    return text if torch.cuda.is_available() else text + " (bundled, no GPU)"


def report() -> HardwareReport:
    """Describe this machine: CPU, CUDA devices, NCCL/cuDNN, MPS/macOS, optional packages, versions."""
    devices: list[CudaDevice] = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            devices.append(CudaDevice(i, p.name, (p.major, p.minor), p.total_memory / 2**30))
    macos = platform.mac_ver()[0] or None
    return HardwareReport(
        python=platform.python_version(),
        torch=torch.__version__,
        torch_cuda=torch.version.cuda,
        platform=platform.system(),
        machine=platform.machine(),
        cpu_cores=os.cpu_count() or 1,
        cuda_devices=tuple(devices),
        nccl=_nccl_version(),
        cudnn=_cudnn_version(),
        mps_built=torch.backends.mps.is_built(),
        mps_available=torch.backends.mps.is_available(),
        macos=macos,
        nixl=_importable("nixl"),
        torchao=_importable("torchao"),
        free_threaded=sysconfig.get_config_var("Py_GIL_DISABLED") == 1,
    )


def nvidia_smi(args: Sequence[str], timeout: float = 30.0) -> str | None:
    """stdout of `nvidia-smi *args`, or None where it is absent, fails or times out (the one place it runs)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


# `NVRM version: NVIDIA UNIX [Open ]Kernel Module[ for x86_64]  580.65.06  ...`; else any `NNN.N.N` in it.
_PROC_DRIVER = (re.compile(r"Kernel Module(?: for [\w-]+)?\s+(\d+\.\d+(?:\.\d+)?)"),
                re.compile(r"\s(\d{3}\.\d+\.\d+)\s"))


def driver_version(proc: str | Path = "/proc/driver/nvidia/version") -> str | None:
    """The NVIDIA driver's version (`580.65.06`): from the kernel module's `proc` file, else from `nvidia-smi`;
    None without one."""
    try:
        text = Path(proc).read_text()
    except OSError:
        text = ""
    for pattern in _PROC_DRIVER:
        if m := pattern.search(text):
            return m.group(1)
    out = nvidia_smi(["--query-gpu=driver_version", "--format=csv,noheader"])
    lines = out.strip().splitlines() if out else []
    return lines[0].strip() if lines else None


def driver_cuda_version() -> tuple[int, int] | None:
    """The newest CUDA version the installed driver supports (`cuDriverGetVersion` of libcuda), or None without
    a driver: what a CUDA wheel is compared with (chapter 0's doctor, chapter 7's checklist)."""
    name = ctypes.util.find_library("cuda") or ("libcuda.so.1" if sys.platform.startswith("linux") else None)
    if not name:
        return None
    try:
        lib = ctypes.CDLL(name)
        v = ctypes.c_int()
        if lib.cuDriverGetVersion(ctypes.byref(v)) == 0 and v.value:
            return v.value // 1000, (v.value % 1000) // 10
    except (OSError, AttributeError):
        pass
    return None


def summary() -> str:
    """Short one-line hardware description used in stamps (`CPU x86_64, 2 cores, no CUDA GPU`)."""
    return report().short()


def _met(need: str, hw: HardwareReport) -> bool:
    m = parse_need(need)
    n = len(hw.cuda_devices)
    if need == "cuda":
        return n >= 1
    if m.group(2):
        return n >= int(m.group(2))
    if m.group(3):
        return any(sm_admits(m.group(3), d.capability) for d in hw.cuda_devices)
    if need == "mps":
        return hw.mps_available
    if m.group(4):
        return hw.macos is not None and version_tuple(hw.macos) >= version_tuple(m.group(4))
    if need == "nixl":
        return hw.nixl
    if need == "torchao":
        return hw.torchao
    if need == "nccl":
        return n >= 1 and torch.distributed.is_nccl_available()
    if need == "free-threaded":
        return hw.free_threaded
    raise AssertionError(need)


def _has(need: str, hw: HardwareReport) -> str:
    if need.startswith(("cuda", "sm_", "nccl")):
        if not hw.cuda_devices:
            return "no CUDA GPU"
        return ", ".join(f"{d.name} ({d.sm})" for d in hw.cuda_devices)
    if need == "mps" or need.startswith("macos"):
        if hw.macos is None:
            return f"{hw.platform} (no MPS)"
        return f"macOS {hw.macos}, MPS {'available' if hw.mps_available else 'not available'}"
    if need == "free-threaded":
        return "a Python with the GIL"  # no version: a stored skip line must not depend on the patch release
    return "not installed"


def check(*needs: str, hw: HardwareReport | None = None) -> list[str]:
    """Return the needs (from `requires`' vocabulary) this machine does not meet; raise on unknown needs."""
    if not needs:
        raise ValueError("check() needs at least one requirement, e.g. check('cuda>=2')")
    for need in needs:
        parse_need(need)
    hw = hw or report()
    return [n for n in needs if not _met(n, hw)]


def requires(*needs: str, shows: str, hw: HardwareReport | None = None, file=None) -> bool:
    """Gate a notebook cell: True if every need is met; else print one line saying what is missing.

    `shows` completes the sentence "this cell would have shown ...". Used throughout chapters 1-6.
    """
    if not shows or not isinstance(shows, str):
        raise ValueError("requires(): `shows` must say what the cell would have shown, e.g. shows='busbw'")
    reason = unmet(*needs, hw=hw)
    if reason is None:
        return True
    print(f"[skipped] {reason}. This cell would have shown {shows}.", file=file or sys.stdout)
    return False


def unmet(*needs: str, hw: HardwareReport | None = None) -> str | None:
    """None when this machine meets every need; else "needs <what>; this machine has <what it has>", the words
    of a gated cell's skip line and of `python -m pt215.verify`'s skip reason."""
    hw = hw or report()
    missing = check(*needs, hw=hw)
    if not missing:
        return None
    wanted = " and ".join(describe_need(n) for n in missing)
    has = "; ".join(dict.fromkeys(_has(n, hw) for n in missing))
    return f"needs {wanted}; this machine has {has}"
