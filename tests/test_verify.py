"""pt215.verify, pt215.fake_cuda, pt215.hardware_runs and pt215.links (the book's hardware paths)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from pt215 import fp8, hardware_runs, links, moe, verify
from pt215.hardware import HardwareReport, check

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "hardware-run-gpu.json"
RECORDS = sorted((ROOT / "data" / "hardware-runs").glob("*.json"))
CPU = HardwareReport(python="3.11.7", torch="2.15.0", torch_cuda="13.2", platform="Linux", machine="x86_64",
                     cpu_cores=2)


def test_list_names_at_least_20_paths_covering_chapters_1_to_6(capsys):
    assert verify.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert f"{len(verify.PATHS)} gated paths" in out and len(verify.PATHS) >= 20
    assert {p.chapter for p in verify.PATHS} >= {1, 2, 3, 4, 5, 6}
    ids = [p.id for p in verify.PATHS]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("path", verify.PATHS, ids=lambda p: p.id)
def test_each_path_names_real_needs_and_an_existing_page(path):
    if path.needs:
        check(*path.needs, hw=CPU)  # raises on an unknown need
    assert (ROOT / path.where).is_file(), path.where
    assert path.fake == (not path.needs)


def test_gpu_paths_are_skipped_with_the_reason_on_a_cpu_machine():
    gpu = [p for p in verify.PATHS if any(n.startswith(("cuda", "sm_", "nccl", "mps")) for n in p.needs)]
    rows = verify.run_paths(gpu, CPU, echo=False)
    assert all(r["status"] == "skipped" and "this machine" in r["reason"] for r in rows)


@pytest.fixture(scope="module")
def fake_record(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("verify") / "rec.json"
    assert verify.main(["--only", "fake", "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_fake_cuda_checks_pass_and_say_no_kernel_ran(fake_record):
    checks = fake_record["checks"]
    assert len(checks) >= 6
    for c in checks:
        assert c["status"] == "passed", c
        assert c["mode"] == "fake CUDA: shapes and dtypes checked, no kernel ran"
    hardware_runs.validate_record(fake_record)
    by_id = {c["id"]: c for c in checks}
    assert "mat2 must be col_major" in by_id["ch6.fake-scaled-mm-layout"]["figures"]["row_major"]
    cases = by_id["ch5.fake-varlen"]["figures"]["backend by GPU"]
    assert cases["sm_120, cuDNN 9.26"]["backend"] == "flash"


def test_a_failing_check_is_recorded_and_exits_1(tmp_path, monkeypatch, capsys):
    def broken() -> verify.Outcome:
        raise AssertionError("busbw 0 GB/s")

    bad = verify.GatedPath("ch9.broken", 9, "a check that fails", "README.md", (), broken, fake=True)
    monkeypatch.setattr(verify, "PATHS", (bad,))
    out = tmp_path / "rec.json"
    assert verify.main(["--out", str(out), "--skip-boundary"]) == 1
    rec = json.loads(out.read_text())
    assert "boundary" not in rec
    assert rec["checks"][0]["status"] == "failed" and "busbw 0 GB/s" in rec["checks"][0]["reason"]
    assert "FAILED: AssertionError: busbw 0 GB/s" in capsys.readouterr().out


def test_list_names_the_issue_24_paths_and_the_boundary_run(capsys):
    assert verify.main(["--list"]) == 0
    out = capsys.readouterr().out
    for pid in ("ch1.window-put", "ch1.time-estimate", "ch2.debug-server-nccl2", "ch2.fr-nccl-legacy-py-watchdog",
                "ch4.fsdp-graph-whole-step", "ch6.mps-record-stream", "ch6.mps-kernels", "ch5.paged-attention"):
        assert pid in out, pid
    assert "run to the hardware boundary of" in out


def test_a_boundary_failure_is_recorded_and_exits_1(tmp_path, monkeypatch):
    from pt215 import boundary

    bad = boundary.Command("chapters/02-flight-recorder/02-9-x.md", 3, "debug_server.py", 2,
                           ("--backend", "nccl", "--timeout", "10", "--stuck", "5"))
    monkeypatch.setattr(verify, "PATHS", ())
    monkeypatch.setattr(boundary, "commands", lambda root=boundary.ROOT: [bad])
    out = tmp_path / "rec.json"
    assert verify.main(["--only", "boundary", "--out", str(out)]) == 1
    rec = json.loads(out.read_text())
    assert rec["checks"] == [] and rec["boundary"]["commands"] == 1
    assert "--timeout (10.0) < --stuck (5.0)" in rec["boundary"]["failed"][0]["detail"]
    hardware_runs.validate_record(rec)


def test_only_that_matches_nothing_is_a_clear_error():
    with pytest.raises(SystemExit, match="matches no gated path"):
        verify.main(["--only", "no-such-path", "--list"])


# ------------------------------------------------------------------------------------------- records


@pytest.mark.parametrize("path", [FIXTURE, *RECORDS], ids=lambda p: p.name)
def test_records_follow_the_schema(path):
    hardware_runs.validate_record(json.loads(path.read_text()), path.name)


def test_data_records_are_not_fixtures():
    for path in RECORDS:
        assert "FIXTURE" not in path.read_text(), path.name


def test_a_gpu_pass_without_a_gpu_in_the_record_is_rejected():
    rec = json.loads(FIXTURE.read_text())
    rec["machine"]["gpus"] = []
    with pytest.raises(ValueError, match="passed for real but the machine lacks"):
        hardware_runs.validate_record(rec)
    rec = json.loads(FIXTURE.read_text())
    del rec["checks"][1]["reason"]
    with pytest.raises(ValueError, match="without a reason"):
        hardware_runs.validate_record(rec)


def test_rendering_names_the_runs_and_what_nothing_verified():
    rec = json.loads(FIXTURE.read_text())
    ch1 = [p for p in verify.PATHS if p.chapter == 1]
    by_id = {p.id: hardware_runs.classify(p, [("f.json", rec)]) for p in ch1}
    assert by_id["ch1.busbw"] == ("hardware", [
        "passed on 2x FIXTURE GPU sm_90, torch 2.15.0, driver TEST-DRIVER, cuDNN 9.26.0, 2000-01-01"])
    kind, lines = by_id["ch1.shrink-group"]
    assert kind == "failed" and lines[0].startswith("FAILED on 2x FIXTURE GPU")
    assert by_id["ch1.eager-init"] == ("none", ["nothing has run it yet"])
    cpu = copy.deepcopy(rec)
    cpu["machine"].update(gpus=[], summary="CPU x86_64, 2 cores, no CUDA GPU")
    cpu["checks"] = [{"id": "ch5.fake-nvfp4", "chapter": 5, "title": "t", "needs": [], "status": "passed",
                      "mode": "fake CUDA: shapes and dtypes checked, no kernel ran"},
                     {"id": "ch3.nixl-api-tour", "chapter": 3, "title": "t", "needs": ["nixl"], "status": "passed",
                      "mode": "real"}]
    paths = {p.id: p for p in verify.PATHS}
    kind, lines = hardware_runs.classify(paths["ch5.fake-nvfp4"], [("c.json", cpu)])
    assert kind == "fake" and "shapes and dtypes, no kernel ran" in lines[0]
    assert hardware_runs.classify(paths["ch3.nixl-api-tour"], [("c.json", cpu)])[0] == "cpu"
    n_hw = sum(bool(p.needs) for p in verify.PATHS)
    assert hardware_runs.summary_line(verify.PATHS, [("c.json", cpu)]) == (
        f"0 of {n_hw} hardware paths have run on hardware; 1 checked on fake CUDA; 1 on CPU")


def test_needs_read_as_words():
    assert hardware_runs.need_words(("cuda>=2", "nccl")) == "≥ 2 CUDA GPUs and NCCL with a CUDA GPU"
    assert hardware_runs.need_words(()) == "nothing (fake CUDA)"


def test_the_directive_lists_hardware_runs_and_collapses_the_rest():
    rec = json.loads(FIXTURE.read_text())
    ch1 = [p for p in verify.PATHS if p.chapter == 1]
    nodes_ = hardware_runs.render(ch1, [("f.json", rec)])
    text = "\n".join(n.astext() for n in nodes_)
    assert text.startswith(f"1 of {len(ch1)} hardware paths have run on hardware; 0 checked on fake CUDA; 0 on CPU")
    assert "Run on hardware (1)" in text
    done, details = text.index("ch1.busbw"), text.index("<details")
    assert done < details and text.index("ch1.eager-init") > details and text.rstrip().endswith("</details>")
    assert "ch1.eager-init (≥ 2 CUDA GPUs and NCCL with a CUDA GPU): nothing has run it yet." in text


# ------------------------------------------------------------------------------------------- links

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


# ------------------------------------------------------------------------------------------- fp8 syncs


def test_quantize_checks_finite_on_cpu_and_only_on_request_elsewhere():
    x = torch.tensor([[1.0, float("inf")]])
    with pytest.raises(ValueError, match="inf or nan"):
        fp8.quantize(x)
    assert fp8.quantize(x, check_finite=False).data.shape == (1, 2)


def test_moe_loop_bounds_are_checked():
    x, w = torch.randn(4, 8), torch.randn(2, 3, 8)
    offs = torch.tensor([1, 4], dtype=torch.int32)
    ref = moe.moe_loop(x, w, offs)
    assert torch.equal(moe.moe_loop(x, w, offs, validate=False, bounds=[1, 4]), ref)
    with pytest.raises(ValueError, match="bounds must be 2 Python ints"):
        moe.moe_loop(x, w, offs, bounds=[4])


def test_table_output_is_one_line_per_path():
    rows = verify.run_paths([p for p in verify.PATHS if p.needs][:3], CPU, echo=False)
    text = verify.format_table(rows)
    assert text.count("skipped: needs") == 3 and text.endswith("0 passed, 0 failed, 3 skipped")
