"""Measure what the participant install downloads and takes on disk, default and `--cpu` ("Install and run").

    .venv/bin/python scripts/measure_install_size.py --venv /tmp/fresh-venv

Downloads the wheels of `requirements-participant.txt` for this Python and platform (`pip download`, into a
temporary folder) and splits them into torch with the CUDA-only packages it pulls in on Linux (`nvidia-*`,
`cuda-*`, `triton`) and the rest. The `--cpu` choice replaces the first group by torch's CPU wheel from
https://download.pytorch.org/whl/cpu: its size is measured when that index answers, and written as null
otherwise. With `--venv DIR` (a virtual environment made by `scripts/install.sh --venv DIR`), it also measures
the disk the environment takes (allocated blocks) and the part of it that the same packages take. Writes
data/workshop/install-size.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "data" / "workshop" / "install-size.json"
REQUIREMENTS = ROOT / "requirements-participant.txt"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
CUDA_ONLY_WHEEL = re.compile(r"^(torch-|nvidia_|cuda_|triton-)", re.I)
CUDA_ONLY_DIR = re.compile(r"^(torch|torchgen|functorch|nvidia|cuda|triton)([-_.].*)?$", re.I)


def _pip_download(args: list[str], dest: Path, timeout: float) -> bool:
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "-d", str(dest), *args]
    try:
        return subprocess.run(cmd, timeout=timeout, capture_output=True).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _disk(path: Path) -> int:
    """Allocated bytes under `path` (what `du` counts), each inode once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def download_sizes(timeout: float) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="pt215-dl-"))
    try:
        if not _pip_download(["-r", str(REQUIREMENTS)], tmp / "all", timeout):
            raise SystemExit(f"pip download -r {REQUIREMENTS.name} failed")
        wheels = {p.name: p.stat().st_size for p in (tmp / "all").iterdir()}
        cuda = sum(s for n, s in wheels.items() if CUDA_ONLY_WHEEL.match(n))
        cpu_wheel = None
        cpu_unpacked = None
        torch_pin = next(line.strip() for line in REQUIREMENTS.read_text().splitlines() if line.startswith("torch=="))
        if _pip_download([torch_pin, "--no-deps", "--index-url", CPU_INDEX], tmp / "cpu", min(timeout, 300)):
            (wheel,) = (tmp / "cpu").iterdir()
            cpu_wheel = wheel.stat().st_size
            with zipfile.ZipFile(wheel) as z:
                cpu_unpacked = sum(i.file_size for i in z.infolist())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    total = sum(wheels.values())
    return {"total_bytes": total, "cuda_only_bytes": cuda, "rest_bytes": total - cuda, "wheels": len(wheels),
            "cpu_torch_wheel_bytes": cpu_wheel, "cpu_torch_unpacked_bytes": cpu_unpacked,
            "cpu_choice_bytes": None if cpu_wheel is None else total - cuda + cpu_wheel}


def disk_sizes(venv: Path, cpu_unpacked: int | None) -> dict:
    site = next(venv.glob("lib/python3*/site-packages"), None)
    if site is None:
        raise SystemExit(f"--venv {venv}: no lib/python3*/site-packages in it; make it with scripts/install.sh")
    total = _disk(venv)
    cuda = sum(_disk(p) if p.is_dir() else p.lstat().st_blocks * 512
               for p in site.iterdir() if CUDA_ONLY_DIR.match(p.name))
    return {"total_bytes": total, "cuda_only_bytes": cuda, "rest_bytes": total - cuda,
            "cpu_choice_bytes": None if cpu_unpacked is None else total - cuda + cpu_unpacked}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--venv", type=Path, help="a virtual environment made by scripts/install.sh, to measure its disk")
    p.add_argument("--timeout", type=float, default=1800, help="seconds for each pip download")
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args(argv)
    if a.venv is not None and not a.venv.is_dir():
        p.error(f"--venv must be an existing virtual environment folder; got {a.venv}")
    download = download_sizes(a.timeout)
    disk = disk_sizes(a.venv, download["cpu_torch_unpacked_bytes"]) if a.venv else None
    if download["cpu_torch_wheel_bytes"] is None:
        how = ("The `--cpu` column is the rest of the install, measured: everything but torch and the CUDA "
               f"packages (`nvidia-*`, `cuda-*`, `triton`) it pulls in, {download['rest_bytes'] / 1e9:.2f} GB of "
               "wheels" + (f" and {disk['rest_bytes'] / 1e9:.2f} GB on disk" if disk else "")
               + f"; torch's CPU wheel from {CPU_INDEX} adds its own size (its index did not answer the "
               "measuring script).")
    else:
        how = ("The `--cpu` column: the same wheels with torch's CPU wheel in place of torch and the CUDA "
               "packages it pulls in (`nvidia-*`, `cuda-*`, `triton`).")
    prov = {"date": dt.date.today().isoformat(), "python": platform.python_version(),
            "machine": f"{platform.system()} {platform.machine()}",
            "command": "python scripts/measure_install_size.py" + (" --venv VENV" if a.venv else "")}
    out = {"provenance": prov, "download": download,
           "disk": disk or {"total_bytes": None, "cuda_only_bytes": None, "rest_bytes": None,
                            "cpu_choice_bytes": None},
           "cpu_choice_how": how}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
