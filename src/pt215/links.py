"""The peak of the link a collective crosses, for chapter 1's busbw figures (notebook 03, `bandwidth.py`).

busbw (nccl-tests' bus bandwidth) is per GPU and per direction, so its ceiling is the bandwidth of the link
between the GPUs, not the GPU's memory copy bandwidth (HBM is 10x faster than NVLink). `link_peak` reads the
GPU pair's connection from `nvidia-smi topo -m` (`NV18` = 18 NVLinks, `PIX`/`PXB`/`PHB`/`NODE`/`SYS` = PCIe,
through switches, the host bridge or the CPU interconnect) and turns it into a per-direction peak:

- NVLink: links x per-link rate of the generation (NVLink 3, sm_80: 25 GB/s; NVLink 4, sm_90: 25 GB/s;
  NVLink 5, sm_100: 50 GB/s, per direction per link);
- PCIe: the x16 rate of the generation `nvidia-smi` reports (gen 4: 32 GB/s, gen 5: 64 GB/s, gen 6: 128 GB/s,
  per direction, before protocol overhead). Through `SYS` (across CPU sockets) even that is optimistic.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import asdict, dataclass

__all__ = ["LinkPeak", "NVLINK_GBPS_PER_LINK", "PCIE_X16_GBPS", "link_peak", "parse_topology"]

NVLINK_GBPS_PER_LINK: dict[int, tuple[int, float]] = {8: (3, 25.0), 9: (4, 25.0), 10: (5, 50.0)}
"""compute capability major -> (NVLink generation, GB/s per link per direction)."""
PCIE_X16_GBPS: dict[int, float] = {3: 16.0, 4: 32.0, 5: 64.0, 6: 128.0}
"""PCIe generation -> GB/s per direction of an x16 link."""


@dataclass(frozen=True)
class LinkPeak:
    """The slowest link between the first `n` GPUs: kind, peak GB/s per direction, how it was derived."""

    kind: str
    GBps: float
    how: str

    def as_dict(self) -> dict:
        return asdict(self)


def parse_topology(text: str, n: int) -> list[str]:
    """The connection codes (`NV18`, `PIX`, `SYS`, ...) between every pair of GPUs 0..n-1 in `topo -m` output."""
    if n < 2:
        raise ValueError(f"n must be >= 2 GPUs to have a link between them, got {n}")
    rows = {}
    for line in text.splitlines():
        m = re.match(r"^\s*GPU(\d+)\s+(.*)$", line)
        if m:
            rows[int(m.group(1))] = m.group(2).split()
    missing = [i for i in range(n) if i not in rows]
    if missing:
        raise ValueError(f"nvidia-smi topo -m output has no row for GPU(s) {missing}")
    return [rows[i][j] for i in range(n) for j in range(i + 1, n)]


def link_peak(n: int, capability: tuple[int, int], *, topo: str | None = None, pcie_gen: int | None = None
              ) -> LinkPeak:
    """Peak per-direction bandwidth of the slowest link among GPUs 0..n-1 (GB/s, 10**9 B/s).

    `topo` is `nvidia-smi topo -m` output and `pcie_gen` the PCIe generation (`nvidia-smi
    --query-gpu=pcie.link.gen.max`); both are read from `nvidia-smi` when omitted.
    """
    if topo is None:
        topo = _smi(["topo", "-m"])
    codes = parse_topology(topo, n)
    nv = [int(c[2:]) for c in codes if re.fullmatch(r"NV\d+", c)]
    if len(nv) == len(codes):
        if capability[0] not in NVLINK_GBPS_PER_LINK:
            raise ValueError(f"no NVLink rate known for compute capability {capability}")
        gen, rate = NVLINK_GBPS_PER_LINK[capability[0]]
        links = min(nv)
        return LinkPeak(f"NVLink {gen}", links * rate, f"{links} links x {rate:g} GB/s per direction "
                        f"(nvidia-smi topo -m: NV{links})")
    if pcie_gen is None:
        pcie_gen = int(_smi(["--query-gpu=pcie.link.gen.max", "--format=csv,noheader"]).split()[0])
    if pcie_gen not in PCIE_X16_GBPS:
        raise ValueError(f"unknown PCIe generation {pcie_gen}")
    worst = next((c for c in ("SYS", "NODE", "PHB", "PXB", "PIX") if c in codes), codes[0])
    return LinkPeak(f"PCIe gen {pcie_gen} x16", PCIE_X16_GBPS[pcie_gen],
                    f"{PCIE_X16_GBPS[pcie_gen]:g} GB/s per direction (nvidia-smi topo -m: {worst})")


def _smi(args: list[str]) -> str:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise FileNotFoundError("nvidia-smi not found: link_peak needs it (or pass topo= and pcie_gen=)")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=30, check=True).stdout
