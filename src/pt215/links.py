"""The peak of the link a collective crosses, for chapter 1's busbw figures (notebook 1.3, `bandwidth.py`).

busbw (nccl-tests' bus bandwidth) is per GPU and per direction, so its ceiling is the bandwidth of the link
between the GPUs, not the GPU's memory copy bandwidth (HBM is 10x faster than NVLink). `link_peak` reads the
GPU pair's connection from `nvidia-smi topo -m` (`NV18` = 18 NVLinks, `PIX`/`PXB`/`PHB`/`NODE`/`SYS` = PCIe,
through switches, the host bridge or the CPU interconnect) and turns it into a per-direction peak:

- NVLink: links x per-link rate of the generation (NVLink 3, sm_80: 25 GB/s; NVLink 4, sm_90: 25 GB/s;
  NVLink 5, sm_100: 50 GB/s, per direction per link);
- PCIe: the x16 rate of the generation `nvidia-smi` reports (gen 4: 32 GB/s, gen 5: 64 GB/s, gen 6: 128 GB/s,
  per direction, before protocol overhead). Through `SYS` (across CPU sockets) even that is optimistic.

The GPUs are the job's: `CUDA_VISIBLE_DEVICES` maps the ranks' device indices to the physical rows of
`nvidia-smi topo -m`. A job over several nodes crosses the network, whose peak no local tool reports: it is
unknown (`GBps` None) unless given (`net_gbps`, the per-GPU network rate per direction).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from pt215.hardware import nvidia_smi

__all__ = ["LinkPeak", "NVLINK_GBPS_PER_LINK", "PCIE_X16_GBPS", "link_peak", "parse_topology", "visible_gpus"]

NVLINK_GBPS_PER_LINK: dict[int, tuple[int, float]] = {8: (3, 25.0), 9: (4, 25.0), 10: (5, 50.0)}
"""compute capability major -> (NVLink generation, GB/s per link per direction)."""
PCIE_X16_GBPS: dict[int, float] = {3: 16.0, 4: 32.0, 5: 64.0, 6: 128.0}
"""PCIe generation -> GB/s per direction of an x16 link."""


@dataclass(frozen=True)
class LinkPeak:
    """The slowest link between the job's GPUs: kind, peak GB/s per direction (None: unknown), how derived."""

    kind: str
    GBps: float | None
    how: str

    def as_dict(self) -> dict:
        return asdict(self)


def parse_topology(text: str, n: int | Sequence[int]) -> list[str]:
    """The connection codes (`NV18`, `PIX`, `SYS`, ...) between every pair of the physical GPUs `n` (a list of
    indices, or an int for GPUs 0..n-1) in `topo -m` output."""
    gpus = list(range(n)) if isinstance(n, int) else list(n)
    if len(gpus) < 2:
        raise ValueError(f"n must be >= 2 GPUs to have a link between them, got {n}")
    rows = {}
    for line in text.splitlines():
        m = re.match(r"^\s*GPU(\d+)\s+(.*)$", line)
        if m:
            rows[int(m.group(1))] = m.group(2).split()
    missing = [i for i in gpus if i not in rows]
    if missing:
        raise ValueError(f"nvidia-smi topo -m output has no row for GPU(s) {missing}")
    return [rows[i][j] for k, i in enumerate(gpus) for j in gpus[k + 1:]]


def visible_gpus(n: int, visible: str | None = None) -> list[int]:
    """The physical indices of the job's GPUs 0..n-1 under `CUDA_VISIBLE_DEVICES` (`visible`; read from the
    environment when None). Raises ValueError when it names GPUs by UUID or MIG instance, or too few."""
    if visible is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not visible.strip():
        return list(range(n))
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if not all(e.isdigit() for e in entries):
        raise ValueError(f"CUDA_VISIBLE_DEVICES={visible!r} names GPUs by UUID or MIG instance: their rows in "
                         "nvidia-smi topo -m are not known; give the peak instead")
    if len(entries) < n:
        raise ValueError(f"CUDA_VISIBLE_DEVICES={visible!r} shows {len(entries)} GPU(s), fewer than the {n} asked for")
    return [int(e) for e in entries[:n]]


def link_peak(n: int, capability: tuple[int, int], *, topo: str | None = None, pcie_gen: int | None = None,
              local: int | None = None, net_gbps: float | None = None, visible: str | None = None) -> LinkPeak:
    """Peak per-direction bandwidth of the slowest link among the job's `n` ranks (GB/s, 10**9 B/s).

    `local` is the number of ranks per node (default: `LOCAL_WORLD_SIZE`, else `n`). When `n` > `local` the
    job spans nodes and the slowest link is the network: its peak is `net_gbps` when given, else unknown
    (`GBps` None). On one node, `topo` is `nvidia-smi topo -m` output and `pcie_gen` the PCIe generation
    (`nvidia-smi --query-gpu=pcie.link.gen.max`), both read from `nvidia-smi` when omitted; the GPUs are the
    physical ones `CUDA_VISIBLE_DEVICES` (`visible`) maps ranks 0..n-1 to. Without `nvidia-smi` (absent, failing),
    a peak that needs it raises FileNotFoundError; output it cannot read raises ValueError.
    """
    if local is None:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", n))
    if net_gbps is not None and not net_gbps > 0:
        raise ValueError(f"net_gbps must be a positive GB/s per direction, got {net_gbps!r}")
    if n > local:
        nodes = f"{n} ranks on {-(-n // local)} nodes of {local}"
        if net_gbps is not None:
            return LinkPeak("network", float(net_gbps), f"{net_gbps:g} GB/s per direction per GPU, as given ({nodes})")
        return LinkPeak("network", None, f"unknown: {nodes} cross the network, whose peak no local tool reports; "
                        "measure it or give the NIC's per-GPU rate")
    if topo is None:
        topo = _smi(["topo", "-m"])
    codes = parse_topology(topo, visible_gpus(n, visible))
    nv = [int(c[2:]) for c in codes if re.fullmatch(r"NV\d+", c)]
    if len(nv) == len(codes):
        if capability[0] not in NVLINK_GBPS_PER_LINK:
            raise ValueError(f"no NVLink rate known for compute capability {capability}")
        gen, rate = NVLINK_GBPS_PER_LINK[capability[0]]
        links = min(nv)
        return LinkPeak(f"NVLink {gen}", links * rate, f"{links} links x {rate:g} GB/s per direction "
                        f"(nvidia-smi topo -m: NV{links})")
    if pcie_gen is None:
        pcie_gen = _pcie_gen(_smi(["--query-gpu=pcie.link.gen.max", "--format=csv,noheader"]))
    if pcie_gen not in PCIE_X16_GBPS:
        raise ValueError(f"unknown PCIe generation {pcie_gen}")
    worst = next((c for c in ("SYS", "NODE", "PHB", "PXB", "PIX") if c in codes), codes[0])
    return LinkPeak(f"PCIe gen {pcie_gen} x16", PCIE_X16_GBPS[pcie_gen],
                    f"{PCIE_X16_GBPS[pcie_gen]:g} GB/s per direction (nvidia-smi topo -m: {worst})")


def _smi(args: list[str]) -> str:
    out = nvidia_smi(args)
    if out is None:
        raise FileNotFoundError(f"nvidia-smi {' '.join(args)} gave nothing (not installed, failed or timed out): "
                                "link_peak needs it (or pass topo= and pcie_gen=)")
    return out


def _pcie_gen(text: str) -> int:
    first = text.split()[0] if text.split() else ""
    if not first.isdigit():
        raise ValueError(f"nvidia-smi --query-gpu=pcie.link.gen.max printed {text.strip()!r}, not a PCIe generation: "
                         "pass pcie_gen=")
    return int(first)
