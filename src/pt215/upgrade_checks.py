"""The upgrade checklist's environment checks for this machine (chapter 7, "Upgrading a job to 2.15").

`environment_checks()` returns one `pt215.checks.Check` per item: ok / warn / fail, or skip where the item
does not apply here (no GPU, not macOS, not ROCm). `python -m pt215.doctor --upgrade` prints the same list.
Every check takes its inputs as arguments with this machine's values as defaults, so each verdict can be
tested on any machine.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from pt215.checks import Check

__all__ = ["environment_checks", "check_python", "check_torch", "check_wheel", "check_driver", "check_nccl_backend",
           "check_nccl_version", "check_rccl_version", "check_macos_mps", "check_fr_env", "check_nccl2_env",
           "check_target_version", "check_weights_only_env", "check_fr_buffer", "NCCL_GATES"]

S_PY = "chapter 7, Python and wheels"
S_MIG = "chapter 1, Migration plan"
S_FR = "chapter 2, The settings"
S_CPP = "chapter 7, C++ extensions"
S_LOAD = "chapter 7, torch.load"
S_MPS = "chapter 6, Where each piece runs"

#: NCCL versions the 2.15 NCCL2 backend checks (`nccl2/NcclApi.hpp`, `nccl2/ProcessGroupNCCL.hpp`).
NCCL_GATES: tuple[tuple[tuple[int, int, int], str], ...] = (
    ((2, 27, 0), "shrink_group (ncclCommShrink)"),
    ((2, 28, 0), "reconfigure (ncclCommRevoke)"),
    ((2, 29, 0), "the shrink/grow fast path and RMA windows"),
    ((2, 29, 7), "communicator memory suspend/resume"),
)
RCCL_MIN = (2, 30, 7)
FR_LEGACY = {
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "TORCH_FR_BUFFER_SIZE",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "TORCH_FR_DUMP_ON_TIMEOUT",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "TORCH_FR_DUMP_TEMP_FILE",
    "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "TORCH_FR_WAIT_TIMEOUT_DUMP_MILSEC",
    "TORCH_NCCL_TRACE_CPP_STACK": "TORCH_FR_CPP_STACK",
}


def _v(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text.split("+")[0])[:3])


def check_python(version: tuple[int, int] | None = None) -> Check:
    """2.15 publishes wheels for CPython 3.11-3.15 (its `Requires-Python: >=3.11`)."""
    v = version or sys.version_info[:2]
    text = f"Python {v[0]}.{v[1]}"
    if v < (3, 11):
        return Check("python", "fail", f"{text}: torch 2.15 has no wheel for it", "use Python 3.11-3.15", S_PY)
    if v > (3, 15):
        return Check("python", "warn", f"{text}: newer than the 3.15 wheels 2.15 ships", "use Python 3.11-3.15",
                     S_PY)
    return Check("python", "ok", f"{text} (2.15 wheels: 3.11-3.15)", section=S_PY)


def check_torch(version: str | None = None) -> Check:
    """The installed torch is 2.15 or newer."""
    if version is None:
        import torch

        version = torch.__version__
    if _v(version)[:2] < (2, 15):
        return Check("torch", "fail", f"torch {version}", "pip install torch==2.15.0", S_PY)
    return Check("torch", "ok", f"torch {version}", section=S_PY)


def check_wheel(cuda: str | None = ..., hip: str | None = ...) -> Check:  # type: ignore[assignment]
    """Which wheel: CUDA 13.2 (the default on PyPI), CUDA 13.4, ROCm, or CPU (`torch.version.cuda` / `.hip`)."""
    if cuda is ... or hip is ...:
        import torch

        cuda = torch.version.cuda if cuda is ... else cuda
        hip = getattr(torch.version, "hip", None) if hip is ... else hip
    if hip:
        return Check("wheel", "ok", f"ROCm {hip} wheel", section=S_PY)
    if not cuda:
        return Check("wheel", "ok", "CPU wheel (no CUDA, no ROCm)", section=S_PY)
    if cuda in ("13.2", "13.4"):
        which = "the default" if cuda == "13.2" else "the alternative"
        return Check("wheel", "ok", f"CUDA {cuda} wheel ({which} 2.15 CUDA wheel)", section=S_PY)
    return Check("wheel", "warn", f"CUDA {cuda} wheel: not one of 2.15's CUDA 13.2 / 13.4 wheels",
                 "install the CUDA 13.2 (PyPI default) or 13.4 wheel", S_PY)


def _driver_from_proc(path: str = "/proc/driver/nvidia/version") -> str | None:
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    m = re.search(r"Kernel Module(?: for [\w-]+)?\s+(\d+\.\d+(?:\.\d+)?)", text) or re.search(r"\s(\d{3}\.\d+\.\d+)\s",
                                                                                               text)
    return m.group(1) if m else None


def check_driver(cuda: str | None = ..., gpus: int | None = None, driver: str | None = ...) -> Check:  # type: ignore[assignment]
    """A CUDA 13.x wheel needs an NVIDIA driver of branch >= 580 (CUDA minor-version compatibility)."""
    if cuda is ...:
        import torch

        cuda = torch.version.cuda
    if gpus is None:
        import torch

        gpus = torch.cuda.device_count() if cuda else 0
    if not cuda:
        return Check("driver", "skip", "not a CUDA wheel", section=S_PY)
    if gpus == 0:
        return Check("driver", "skip", "no CUDA GPU here: the driver check does not apply", section=S_PY)
    if driver is ...:
        driver = _driver_from_proc()
    if driver is None:
        return Check("driver", "warn", "could not read the NVIDIA driver version",
                     "run nvidia-smi: CUDA 13.x needs driver >= 580", S_PY)
    if _v(driver)[0] < 580:
        return Check("driver", "fail", f"NVIDIA driver {driver} is older than the 580 branch CUDA {cuda} needs",
                     "upgrade the driver to >= 580", S_PY)
    return Check("driver", "ok", f"NVIDIA driver {driver} (CUDA 13.x needs >= 580)", section=S_PY)


def check_nccl_backend(env: Mapping[str, str] | None = None, registered: str | None = ...) -> Check:  # type: ignore[assignment]
    """What `init_process_group("nccl")` builds: read from the registry if "nccl" is registered in this
    process already (the variable is read then, once), else predicted from TORCH_DIST_USE_NCCL2."""
    env = os.environ if env is None else env
    if registered is ...:
        registered = None
        try:
            from torch.distributed import Backend

            plugin = Backend._plugins.get("NCCL")
            registered = plugin.creator_fn.__name__ if plugin is not None else None
        except Exception:  # noqa: BLE001 - no distributed support: predict from the variable
            registered = None
    if registered is not None:
        legacy = registered == "_create_nccl_process_group"
        how = f"registered in this process ({registered})"
    else:
        legacy = env.get("TORCH_DIST_USE_NCCL2") == "0"
        how = "predicted from TORCH_DIST_USE_NCCL2=" + (repr(env["TORCH_DIST_USE_NCCL2"])
                                                        if "TORCH_DIST_USE_NCCL2" in env else "(unset)")
    if legacy:
        return Check("nccl backend", "warn", f"'nccl' builds the legacy ProcessGroupNCCL, {how}",
                     "unset TORCH_DIST_USE_NCCL2 after an A/B run on NCCL2", S_MIG)
    return Check("nccl backend", "ok", f"'nccl' builds ProcessGroupNCCL2, {how}", section=S_MIG)


def _nccl_version() -> tuple[int, ...] | None:
    try:
        import torch

        v = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - a build without NCCL
        return None
    return tuple(v) if isinstance(v, tuple) else None


def check_nccl_version(version: tuple[int, ...] | None = ..., hip: str | None = ...) -> Check:  # type: ignore[assignment]
    """The NCCL library torch loads, against the gates of 2.15's NCCL2 backend (NCCL_GATES)."""
    if hip is ...:
        import torch

        hip = getattr(torch.version, "hip", None)
    if hip:
        return Check("nccl version", "skip", "ROCm build: see the rccl check", section=S_MIG)
    if version is ...:
        version = _nccl_version()
    if not version:
        return Check("nccl version", "skip", "no NCCL in this build", section=S_MIG)
    text = ".".join(map(str, version))
    missing = [what for need, what in NCCL_GATES if tuple(version) < need]
    if missing:
        return Check("nccl version", "warn", f"NCCL {text}: too old for " + ", ".join(missing),
                     "use NCCL >= 2.29.7 (the 2.15 wheels bundle 2.30.7)", S_MIG)
    return Check("nccl version", "ok", f"NCCL {text}: meets every NCCL2 gate (2.27 shrink, 2.28 reconfigure, "
                 "2.29 fast path)", section=S_MIG)


def check_rccl_version(hip: str | None = ..., version: tuple[int, ...] | None = ...) -> Check:  # type: ignore[assignment]
    """On ROCm, reconfigure honours its timeout only with RCCL >= 2.30.7 (`nccl2/NcclApi.hpp`)."""
    if hip is ...:
        import torch

        hip = getattr(torch.version, "hip", None)
    if not hip:
        return Check("rccl version", "skip", "not a ROCm build", section=S_MIG)
    if version is ...:
        version = _nccl_version()
    if not version:
        return Check("rccl version", "warn", "could not read the RCCL version", "pip show rocm", S_MIG)
    text = ".".join(map(str, version))
    if tuple(version) < RCCL_MIN:
        return Check("rccl version", "warn", f"RCCL {text} < 2.30.7: reconfigure cannot honour its timeout",
                     "install RCCL >= 2.30.7", S_MIG)
    return Check("rccl version", "ok", f"RCCL {text}", section=S_MIG)


def check_macos_mps(macos: str | None = ...) -> Check:  # type: ignore[assignment]
    """MPS hosts need macOS 15 or newer for 2.15's MPS paths."""
    if macos is ...:
        macos = platform.mac_ver()[0] or None
    if not macos:
        return Check("macos", "skip", "not macOS", section=S_MPS)
    if _v(macos)[:1] < (15,):
        return Check("macos", "fail", f"macOS {macos}: 2.15's MPS paths need macOS >= 15", "upgrade to macOS 15+",
                     S_MPS)
    return Check("macos", "ok", f"macOS {macos}", section=S_MPS)


def check_fr_env(env: Mapping[str, str] | None = None) -> Check:
    """No legacy `TORCH_NCCL_*` flight-recorder names, and not the variable that never existed."""
    env = os.environ if env is None else env
    if "TORCH_NCCL_ENABLE_FLIGHT_RECORDER" in env:
        return Check("flight-recorder variables", "fail", "TORCH_NCCL_ENABLE_FLIGHT_RECORDER is set: no such "
                     "variable, it does nothing", "unset it; the recorder is on when TORCH_FR_BUFFER_SIZE > 0",
                     S_FR)
    legacy = sorted(k for k in FR_LEGACY if k in env)
    if legacy:
        return Check("flight-recorder variables", "warn", "legacy names set: " + ", ".join(legacy),
                     "rename: " + ", ".join(f"{k} -> {FR_LEGACY[k]}" for k in legacy), S_FR)
    return Check("flight-recorder variables", "ok", "no legacy TORCH_NCCL_* recorder names set", section=S_FR)


def check_fr_buffer(env: Mapping[str, str] | None = None) -> Check:
    """The recorder is on (buffer size > 0): what post-mortems of a hang need."""
    env = os.environ if env is None else env
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        if name in env:
            raw = env[name]
            break
    else:
        return Check("flight-recorder buffer", "ok", "default size 2000: recording", section=S_FR)
    try:
        size = int(raw)
    except ValueError:
        return Check("flight-recorder buffer", "warn", f"{name}={raw!r} is not an integer", "set an integer", S_FR)
    if size <= 0:
        return Check("flight-recorder buffer", "warn", f"{name}={size}: the recorder is off, a hang leaves no dump",
                     "unset it or set TORCH_FR_BUFFER_SIZE=2000", S_FR)
    return Check("flight-recorder buffer", "ok", f"{name}={size}: recording", section=S_FR)


def check_nccl2_env(env: Mapping[str, str] | None = None) -> Check:
    """TORCH_DIST_USE_NCCL2: unset is the goal; "0" is the rollback; any other value does nothing."""
    env = os.environ if env is None else env
    if "TORCH_DIST_USE_NCCL2" not in env:
        return Check("TORCH_DIST_USE_NCCL2", "ok", "unset", section=S_MIG)
    value = env["TORCH_DIST_USE_NCCL2"]
    if value == "0":
        return Check("TORCH_DIST_USE_NCCL2", "warn", "'0': the legacy backend, planned for removal",
                     "A/B on NCCL2, then unset it", S_MIG)
    return Check("TORCH_DIST_USE_NCCL2", "warn", f"{value!r}: no effect (only '0' selects the legacy backend)",
                 "unset it", S_MIG)


def _abi_of_installed_headers() -> int | None:
    try:
        import torch
    except ImportError:
        return None
    h = Path(torch.__file__).parent / "include" / "torch" / "headeronly" / "version.h"
    try:
        text = h.read_text()
    except OSError:
        return None
    parts = {k: int(v) for k, v in re.findall(r"#define TORCH_VERSION_(MAJOR|MINOR|PATCH|ABI_TAG) (\d+)", text)}
    if len(parts) != 4:
        return None
    return (parts["MAJOR"] << 56) | (parts["MINOR"] << 48) | (parts["PATCH"] << 40) | parts["ABI_TAG"]


def check_target_version(env: Mapping[str, str] | None = None, abi: int | None = ...) -> Check:  # type: ignore[assignment]
    """`-DTORCH_TARGET_VERSION=` in CFLAGS/CXXFLAGS must not exceed the headers' TORCH_ABI_VERSION."""
    env = os.environ if env is None else env
    if abi is ...:
        abi = _abi_of_installed_headers()
    flags = " ".join(env.get(k, "") for k in ("CFLAGS", "CXXFLAGS", "CPPFLAGS", "NVCC_FLAGS", "TORCH_NVCC_FLAGS"))
    m = re.search(r"-DTORCH_TARGET_VERSION=(0[xX][0-9a-fA-F]+|\d+)", flags)
    headers = f"0x{abi:016x}" if abi is not None else "unknown"
    if not m:
        return Check("TORCH_TARGET_VERSION", "ok", f"not set in compiler flags (headers' TORCH_ABI_VERSION {headers})",
                     section=S_CPP)
    target = int(m.group(1), 0)
    if abi is not None and target > abi:
        return Check("TORCH_TARGET_VERSION", "fail", f"{m.group(1)} > headers' TORCH_ABI_VERSION {headers}: "
                     "a compile error", "lower it to <= the headers' version", S_CPP)
    return Check("TORCH_TARGET_VERSION", "ok", f"{m.group(1)} <= headers' {headers}", section=S_CPP)


def check_weights_only_env(env: Mapping[str, str] | None = None) -> Check:
    """TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD turns off the weights-only default of every torch.load."""
    env = os.environ if env is None else env
    if env.get("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "0").lower() in ("1", "y", "yes", "true"):
        return Check("torch.load default", "warn", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD is set: full unpickling",
                     "unset it; allow your classes with torch.serialization.add_safe_globals", S_LOAD)
    return Check("torch.load default", "ok", "weights_only=True by default", section=S_LOAD)


def environment_checks(env: Mapping[str, str] | None = None) -> list[Check]:
    """Every environment item of the chapter 7 checklist, checked on this machine."""
    return [
        check_python(), check_torch(), check_wheel(), check_driver(), check_nccl_backend(env),
        check_nccl_version(), check_rccl_version(), check_macos_mps(), check_nccl2_env(env), check_fr_env(env),
        check_fr_buffer(env), check_target_version(env), check_weights_only_env(env),
    ]
