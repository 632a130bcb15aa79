"""pt215.verify (runner and command line), the catalogue of gated paths (pt215.verify.paths, pt215.verify.checks),
the record they write (pt215.verify.record) as the website reads it (pt215.site.hardware_runs)."""

from __future__ import annotations

import copy
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pt215.hardware import HardwareReport, check
from pt215.site import hardware_runs
from pt215.verify import checks as path_checks
from pt215.verify import fake_cuda, paths, runner
from pt215.verify.record import RunRecord

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "hardware-run-gpu.json"
RECORDS = sorted((ROOT / "data" / "hardware-runs").glob("*.json"))
CPU = HardwareReport(python="3.11.7", torch="2.15.0", torch_cuda="13.2", platform="Linux", machine="x86_64",
                     cpu_cores=2)


def test_list_names_at_least_20_paths_covering_chapters_1_to_6(capsys):
    assert runner.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert f"{len(runner.PATHS)} gated paths" in out and len(runner.PATHS) >= 20
    assert {p.chapter for p in runner.PATHS} >= {1, 2, 3, 4, 5, 6}
    ids = [p.id for p in runner.PATHS]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("path", runner.PATHS, ids=lambda p: p.id)
def test_each_path_names_real_needs_and_an_existing_page(path):
    if path.needs:
        check(*path.needs, hw=CPU)  # raises on an unknown need
    assert (ROOT / path.where).is_file(), path.where
    assert path.fake == (not path.needs)


def test_gpu_paths_are_skipped_with_the_reason_on_a_cpu_machine():
    gpu = [p for p in runner.PATHS if any(n.startswith(("cuda", "sm_", "nccl", "mps")) for n in p.needs)]
    rows = runner.run_paths(gpu, CPU, echo=False)
    assert all(r.status == "skipped" and "this machine" in r.reason for r in rows)


def test_every_path_has_its_check_and_every_check_its_path():
    checks = {name for name, fn in inspect.getmembers(path_checks, inspect.isfunction)
              if name.startswith("ch") and fn.__module__ == path_checks.__name__}
    names = {p.check_name for p in runner.PATHS}
    assert names == checks, (names - checks, checks - names)
    assert runner.PATHS is paths.PATHS and runner.GatedPath is paths.GatedPath
    assert not [n for n in dir(fake_cuda) if n.startswith("check_") or n == "CHECKS"]  # the mechanism only


def test_the_catalogue_imports_no_torch():
    code = ("import sys, pt215.verify.paths as g, pt215.verify.record; assert 'torch' not in sys.modules; "
            "print(len(g.PATHS))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and int(out.stdout) == len(runner.PATHS), out.stderr[-2000:]


def test_machine_record_asks_hardware_for_the_driver(monkeypatch):
    assert runner.machine_record(CPU).driver is None and runner.machine_record(CPU).gpus == ()
    from pt215.hardware import CudaDevice

    monkeypatch.setattr(runner.hardware, "driver_version", lambda: "580.65.06")
    gpu = HardwareReport(python="3.11.7", torch="2.15.0", torch_cuda="13.2", platform="Linux", machine="x86_64",
                         cpu_cores=2, cuda_devices=(CudaDevice(0, "H200", (9, 0), 139.8),))
    m = runner.machine_record(gpu)
    assert m.driver == "580.65.06" and m.to_dict()["gpus"] == [{"name": "H200", "capability": "sm_90",
                                                                 "memory_gib": 139.8}]


@pytest.fixture(scope="module")
def fake_record(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("verify") / "rec.json"
    assert runner.main(["--only", "fake", "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_fake_cuda_checks_pass_and_say_no_kernel_ran(fake_record):
    checks = fake_record["checks"]
    assert len(checks) >= 6
    for c in checks:
        assert c["status"] == "passed", c
        assert c["mode"] == "fake CUDA: shapes and dtypes checked, no kernel ran"
    RunRecord.from_dict(fake_record)
    by_id = {c["id"]: c for c in checks}
    assert "mat2 must be col_major" in by_id["ch6.fake-scaled-mm-layout"]["figures"]["row_major"]
    cases = by_id["ch5.fake-varlen"]["figures"]["backend by GPU"]
    assert cases["sm_120, cuDNN 9.26"]["backend"] == "flash"


def test_a_failing_check_is_recorded_and_exits_1(tmp_path, monkeypatch, capsys):
    def broken() -> runner.Outcome:
        raise AssertionError("busbw 0 GB/s")

    bad = runner.GatedPath("ch9.broken", 9, "a check that fails", "README.md", (), fake=True)
    monkeypatch.setattr(path_checks, "ch9_broken", broken, raising=False)
    monkeypatch.setattr(runner, "PATHS", (bad,))
    out = tmp_path / "rec.json"
    assert runner.main(["--out", str(out), "--skip-boundary"]) == 1
    rec = json.loads(out.read_text())
    assert "boundary" not in rec
    assert rec["checks"][0]["status"] == "failed" and "busbw 0 GB/s" in rec["checks"][0]["reason"]
    assert "FAILED: AssertionError: busbw 0 GB/s" in capsys.readouterr().out


def test_a_check_that_lacks_an_optional_package_is_skipped(monkeypatch):
    def lacking() -> runner.Outcome:
        raise paths.CheckSkipped("nvidia-cutlass-dsl not installed")

    path = runner.GatedPath("ch9.lacking", 9, "a check without its package", "README.md", (), fake=True)
    monkeypatch.setattr(path_checks, "ch9_lacking", lacking, raising=False)
    (row,) = runner.run_paths([path], CPU, echo=False)
    assert (row.status, row.reason) == ("skipped", "nvidia-cutlass-dsl not installed")
    assert runner.status_text(row) == "skipped: nvidia-cutlass-dsl not installed"


def test_list_names_the_issue_24_paths_and_the_boundary_run(capsys):
    assert runner.main(["--list"]) == 0
    out = capsys.readouterr().out
    for pid in ("ch1.window-put", "ch1.time-estimate", "ch2.debug-server-nccl2", "ch2.fr-nccl-legacy-py-watchdog",
                "ch4.fsdp-graph-whole-step", "ch6.mps-record-stream", "ch6.mps-kernels", "ch5.paged-attention"):
        assert pid in out, pid
    assert "run to the hardware boundary of" in out


def test_a_boundary_failure_is_recorded_and_exits_1(tmp_path, monkeypatch):
    from pt215.verify import boundary

    bad = boundary.Command("chapters/02-flight-recorder/02-9-x.md", 3, "debug_server.py", 2,
                           ("--backend", "nccl", "--timeout", "10", "--stuck", "5"))
    monkeypatch.setattr(runner, "PATHS", ())
    monkeypatch.setattr(boundary, "commands", lambda root=boundary.ROOT: [bad])
    out = tmp_path / "rec.json"
    assert runner.main(["--only", "boundary", "--out", str(out)]) == 1
    rec = json.loads(out.read_text())
    assert rec["checks"] == [] and rec["boundary"]["commands"] == 1
    assert "--timeout (10.0) < --stuck (5.0)" in rec["boundary"]["failed"][0]["detail"]
    assert "debug_server.py --backend nccl" in RunRecord.from_dict(rec).boundary.failed[0].command


def test_only_that_matches_nothing_is_a_clear_error():
    with pytest.raises(SystemExit, match="matches no gated path"):
        runner.main(["--only", "no-such-path", "--list"])


# ------------------------------------------------------------------------------------------- records


@pytest.mark.parametrize("path", [FIXTURE, *RECORDS], ids=lambda p: p.name)
def test_records_follow_the_schema_and_read_back_unchanged(path):
    data = json.loads(path.read_text())
    assert RunRecord.from_dict(data, path.name).to_dict() == data


def test_a_bad_record_names_the_file_and_the_key():
    rec = json.loads(FIXTURE.read_text())
    for change, message in ((lambda r: r.pop("machine"), r"f.json: missing keys \['machine'\]"),
                            (lambda r: r["machine"].pop("driver"), r"f.json: machine is missing \['driver'\]"),
                            (lambda r: r["checks"][0].pop("mode"), r"f.json: check 'ch1.busbw' is missing \['mode'\]"),
                            (lambda r: r["checks"][0].update(status="ok"), "has status 'ok'"),
                            (lambda r: r.update(schema=2), "schema must be 1"),
                            (lambda r: r["machine"]["gpus"][0].update(capability="90"), "sm_NN capability")):
        bad = copy.deepcopy(rec)
        change(bad)
        with pytest.raises(ValueError, match=message):
            RunRecord.from_dict(bad, "f.json")


def test_data_records_are_not_fixtures():
    for path in RECORDS:
        assert "FIXTURE" not in path.read_text(), path.name


def test_a_gpu_pass_without_a_gpu_in_the_record_is_rejected():
    rec = json.loads(FIXTURE.read_text())
    rec["machine"]["gpus"] = []
    with pytest.raises(ValueError, match="passed for real but the machine lacks"):
        RunRecord.from_dict(rec)
    rec = json.loads(FIXTURE.read_text())
    del rec["checks"][1]["reason"]
    with pytest.raises(ValueError, match="without a reason"):
        RunRecord.from_dict(rec)


def test_rendering_names_the_runs_and_what_nothing_verified():
    rec = json.loads(FIXTURE.read_text())
    ch1 = [p for p in runner.PATHS if p.chapter == 1]
    by_id = {p.id: hardware_runs.classify(p, [("f.json", RunRecord.from_dict(rec))]) for p in ch1}
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
    cpu = RunRecord.from_dict(cpu)
    by_id = {p.id: p for p in runner.PATHS}
    kind, lines = hardware_runs.classify(by_id["ch5.fake-nvfp4"], [("c.json", cpu)])
    assert kind == "fake" and "shapes and dtypes, no kernel ran" in lines[0]
    assert hardware_runs.classify(by_id["ch3.nixl-api-tour"], [("c.json", cpu)])[0] == "cpu"
    n_hw = sum(bool(p.needs) for p in runner.PATHS)
    assert hardware_runs.summary_line(runner.PATHS, [("c.json", cpu)]) == (
        f"0 of {n_hw} hardware paths have run on hardware; 1 checked on fake CUDA; 1 on CPU")


def test_needs_read_as_words():
    assert hardware_runs.need_words(("cuda>=2", "nccl")) == "≥ 2 CUDA GPUs and NCCL with a CUDA GPU"
    assert hardware_runs.need_words(()) == "nothing (fake CUDA)"
    with pytest.raises(ValueError, match="unknown requirement .gpu.; expected one of"):
        hardware_runs.need_words(("gpu",))


def test_the_directive_lists_hardware_runs_and_collapses_the_rest():
    rec = json.loads(FIXTURE.read_text())
    ch1 = [p for p in runner.PATHS if p.chapter == 1]
    nodes_ = hardware_runs.render(ch1, [("f.json", RunRecord.from_dict(rec))])
    text = "\n".join(n.astext() for n in nodes_)
    assert text.startswith(f"1 of {len(ch1)} hardware paths have run on hardware; 0 checked on fake CUDA; 0 on CPU")
    assert "Run on hardware (1)" in text
    done, details = text.index("ch1.busbw"), text.index("<details")
    assert done < details and text.index("ch1.eager-init") > details and text.rstrip().endswith("</details>")
    assert "ch1.eager-init (≥ 2 CUDA GPUs and NCCL with a CUDA GPU): nothing has run it yet." in text


def test_table_output_is_one_line_per_path():
    rows = runner.run_paths([p for p in runner.PATHS if p.needs][:3], CPU, echo=False)
    text = runner.format_table(rows)
    assert text.count("skipped: needs") == 3 and text.endswith("0 passed, 0 failed, 3 skipped")


def test_the_hardware_runs_block_counts_agree(monkeypatch):
    """The summary's count of hardware paths and the collapsed list's count are the same paths (no 31 vs 39)."""
    from docutils import nodes

    rec = RunRecord.from_dict(json.loads(FIXTURE.read_text()))
    out = hardware_runs.render(runner.PATHS, [("f.json", rec)])
    raw = next(n for n in out if isinstance(n, nodes.raw)).astext()
    n_hw = sum(bool(p.needs) for p in runner.PATHS)
    done = sum(hardware_runs.classify(p, [("f.json", rec)])[0] == "hardware" for p in runner.PATHS)
    assert f"{n_hw - done} hardware paths not yet run on their hardware" in raw
    assert f"The other {len(runner.PATHS) - done} paths" in raw
    assert all(p.fake for p in runner.PATHS if not p.needs)
