"""pt215.links: the peak of the link between a job's GPUs, from `nvidia-smi topo -m` (chapter 1)."""

from __future__ import annotations

import pytest

from pt215 import links

TOPO_NVL = """\
\tGPU0\tGPU1\tGPU2\tCPU Affinity
GPU0\t X \tNV18\tNV18\t0-47
GPU1\tNV18\t X \tNV18\t0-47
GPU2\tNV18\tNV18\t X \t0-47
"""
TOPO_PCIE = """\
\tGPU0\tGPU1
GPU0\t X \tSYS
GPU1\tSYS\t X
"""


def test_link_peak_from_topology():
    h200 = links.link_peak(3, (9, 0), topo=TOPO_NVL)
    assert (h200.kind, h200.GBps) == ("NVLink 4", 450.0) and "NV18" in h200.how
    assert links.link_peak(2, (10, 0), topo=TOPO_NVL).GBps == 900.0
    pcie = links.link_peak(2, (8, 9), topo=TOPO_PCIE, pcie_gen=4)
    assert (pcie.kind, pcie.GBps) == ("PCIe gen 4 x16", 32.0) and "SYS" in pcie.how
    with pytest.raises(ValueError, match="no row for GPU"):
        links.link_peak(4, (9, 0), topo=TOPO_NVL, visible="")


def test_link_peak_follows_cuda_visible_devices_and_knows_no_network():
    mixed = TOPO_NVL.replace("GPU2\tNV18\tNV18", "GPU2\tSYS\tSYS").replace("GPU0\t X \tNV18\tNV18",
                                                                             "GPU0\t X \tNV18\tSYS")
    mixed = mixed.replace("GPU1\tNV18\t X \tNV18", "GPU1\tNV18\t X \tSYS")
    assert links.visible_gpus(2, "2,0") == [2, 0]
    assert links.link_peak(2, (9, 0), topo=mixed, visible="0,1").kind == "NVLink 4"
    assert links.link_peak(2, (9, 0), topo=mixed, visible="2,0", pcie_gen=5).kind == "PCIe gen 5 x16"
    with pytest.raises(ValueError, match="UUID or MIG"):
        links.link_peak(2, (9, 0), topo=mixed, visible="GPU-1234,GPU-5678")
    net = links.link_peak(16, (9, 0), local=8)  # two nodes: no nvidia-smi is asked
    assert (net.kind, net.GBps) == ("network", None) and "16 ranks on 2 nodes of 8" in net.how
    assert links.link_peak(16, (9, 0), local=8, net_gbps=50).GBps == 50.0
    with pytest.raises(ValueError, match="net_gbps must be a positive"):
        links.link_peak(16, (9, 0), local=8, net_gbps=0)
