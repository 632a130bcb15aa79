"""What this machine has, and gates for cells that need more.

Used by every chapter (see chapter 0, "Before you start"): `report()` describes the machine in one call;
`requires(...)` lets a cell state what it needs and either proceed or print one clear line.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch

__all__ = ["CudaDevice", "HardwareReport", "report", "requires", "check", "sm_admits", "summary", "nvidia_smi",
           "driver_version"]


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


def _nccl_version() -> str | None:
    if not torch.cuda.is_available():
        # The CUDA wheel bundles NCCL even on a CPU-only machine; report it as bundled.
        try:
            v = torch.cuda.nccl.version()
        except Exception:  # noqa: BLE001 - any failure means "not available"
            return None
        return ".".join(map(str, v)) + " (bundled, no GPU)" if isinstance(v, tuple) else str(v)
    v = torch.cuda.nccl.version()
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


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


def driver_version() -> str | None:
    """The NVIDIA driver's version (`580.65.06`) from `nvidia-smi`, or None without one."""
    out = nvidia_smi(["--query-gpu=driver_version", "--format=csv,noheader"])
    lines = out.strip().splitlines() if out else []
    return lines[0].strip() if lines else None


def summary() -> str:
    """Short one-line hardware description used in stamps (`CPU x86_64, 2 cores, no CUDA GPU`)."""
    return report().short()


_NEED = re.compile(r"^(cuda(?:>=(\d+))?|sm_(\d+)|mps|macos>=(\d+(?:\.\d+)?)|nixl|torchao|nccl)$")


def _describe(need: str) -> str:
    m = _NEED.match(need)
    assert m is not None
    if need == "cuda":
        return "a CUDA GPU"
    if m.group(2):
        return f">= {m.group(2)} CUDA GPUs"
    if m.group(3):
        cc = int(m.group(3))
        if cc >= 100:
            return f"a CUDA GPU of the sm_{cc // 10}x family (sm_{cc}+, not a later architecture)"
        return f"a CUDA GPU of compute capability sm_{cc}+"
    if need == "mps":
        return "Apple MPS"
    if m.group(4):
        return f"macOS >= {m.group(4)}"
    if need == "nccl":
        return "NCCL with a CUDA GPU"
    return f"the `{need}` package"


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def sm_admits(need_cc: str | int, capability: tuple[int, int]) -> bool:
    """Whether a device of `capability` meets the need `sm_<need_cc>` (chapters 5 and 6).

    Up to Hopper a need is a floor: `sm_89` (FP8) and `sm_90` are met by every later GPU. From Blackwell on,
    the book's kernels are architecture-specific (tcgen05 GEMMs, cuDNN's SM100 attention): `sm_100` is met by
    the sm_10x family (B200/GB200 10.0, B300 10.3) but not by sm_120 GeForce/RTX PRO cards, which lack them.
    """
    cc = int(need_cc)
    want = (cc // 10, cc % 10)
    if capability < want:
        return False
    return want[0] < 10 or capability[0] == want[0]


def _met(need: str, hw: HardwareReport) -> bool:
    m = _NEED.match(need)
    assert m is not None
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
        return hw.macos is not None and _version_tuple(hw.macos) >= _version_tuple(m.group(4))
    if need == "nixl":
        return hw.nixl
    if need == "torchao":
        return hw.torchao
    if need == "nccl":
        return n >= 1 and torch.distributed.is_nccl_available()
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
    return "not installed"


def check(*needs: str, hw: HardwareReport | None = None) -> list[str]:
    """Return the needs (from `requires`' vocabulary) this machine does not meet; raise on unknown needs."""
    if not needs:
        raise ValueError("check() needs at least one requirement, e.g. check('cuda>=2')")
    for need in needs:
        if not isinstance(need, str) or not _NEED.match(need):
            raise ValueError(
                f"unknown requirement {need!r}; expected one of: 'cuda', 'cuda>=N', 'sm_NN' (e.g. 'sm_90', "
                "'sm_100'), 'mps', 'macos>=N', 'nixl', 'torchao', 'nccl'"
            )
    hw = hw or report()
    return [n for n in needs if not _met(n, hw)]


def requires(*needs: str, shows: str, hw: HardwareReport | None = None, file=None) -> bool:
    """Gate a notebook cell: True if every need is met; else print one line saying what is missing.

    `shows` completes the sentence "this cell would have shown ...". Used throughout chapters 1-6.
    """
    if not shows or not isinstance(shows, str):
        raise ValueError("requires(): `shows` must say what the cell would have shown, e.g. shows='busbw'")
    hw = hw or report()
    missing = check(*needs, hw=hw)
    if not missing:
        return True
    wanted = " and ".join(_describe(n) for n in missing)
    has = "; ".join(dict.fromkeys(_has(n, hw) for n in missing))
    print(f"[skipped] needs {wanted}; this machine has {has}. This cell would have shown {shows}.",
          file=file or sys.stdout)
    return False
