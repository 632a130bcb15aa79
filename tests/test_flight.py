"""Tests for pt215.flight (chapter 2): loading, repair, diagnosis, bad input, and a live gloo hang."""

from __future__ import annotations

import contextlib
import io
import json
import pickle
import textwrap
from pathlib import Path

import pytest

from pt215 import flight
from pt215.flight import DumpError

T0 = 1_700_000_000_000_000_000  # ns


def entry(rec, pg, desc, seq, op="gloo:all_reduce", sizes=((16,),), dtype="Float", pg_id=None, t=0.0):
    return {
        "record_id": rec, "pg_id": int(pg) if pg_id is None else pg_id, "process_group": (pg, desc),
        "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq, "profiling_name": op,
        "time_created_ns": T0 + int(t * 1e9), "input_sizes": [list(s) for s in sizes],
        "input_dtypes": [dtype] * len(sizes), "output_sizes": [list(s) for s in sizes],
        "output_dtypes": [dtype] * len(sizes), "state": "scheduled", "time_discovered_started_ns": None,
        "time_discovered_completed_ns": None, "retired": True, "timeout_ms": 5000, "is_p2p": False,
        "frames": [], "thread_id": "1", "thread_name": "python",
    }


def gloo_dump(entries, world, completed):
    """A dump laid out as torch 2.15's gloo writes it: pg_config keyed by '' and no sub-groups."""
    status = {}
    for e in entries:
        st = status.setdefault(str(e["pg_id"]), {"last_enqueued_collective": -1, "last_started_collective": -1,
                                                  "last_completed_collective": -1})
        st["last_enqueued_collective"] = max(st["last_enqueued_collective"], e["collective_seq_id"])
    for pg_id, seq in completed.items():
        status[str(pg_id)]["last_completed_collective"] = seq
    return {"version": "2.10", "entries": entries, "comm_lib_version": "",
            "pg_config": {"": {"name": "", "desc": "", "ranks": str(list(range(world)))}}, "pg_status": status}


def scenario(kind):
    """Per-rank dumps for 3 ranks, 2 healthy all_reduces on group 0, then the fault at seq 3."""
    dumps = {}
    for r in range(3):
        es = [entry(i, "0", "default_pg", i + 1, t=i) for i in range(2)]
        done = {0: 2}
        culprit = r == 2
        if kind == "healthy":
            es.append(entry(2, "0", "default_pg", 3, t=2))
            done = {0: 3}
        elif kind == "straggler" and not culprit:
            es.append(entry(2, "0", "default_pg", 3, t=2))
        elif kind == "mismatch":
            es.append(entry(2, "0", "default_pg", 3, op="gloo:broadcast" if culprit else "gloo:all_reduce", t=2))
        elif kind == "size":
            es.append(entry(2, "0", "default_pg", 3, sizes=((8,),) if culprit else ((16,),), t=2))
        elif kind == "cycle":  # both groups were used once before; then rank 2 goes to metrics first
            es.append(entry(2, "1", "metrics", 1, t=1.5))
            es.append(entry(3, "1", "metrics", 2, t=2) if culprit else entry(3, "0", "default_pg", 3, t=2))
            done = {0: 2, 1: 1}
        dumps[r] = gloo_dump(es, 3, done)
    return dumps


def write(folder: Path, dumps, fmt="pickle"):
    folder.mkdir(parents=True, exist_ok=True)
    for r, d in dumps.items():
        if fmt == "pickle":
            (folder / f"rank_{r}").write_bytes(pickle.dumps(d))
        else:
            (folder / f"rank_{r}.json").write_text(json.dumps(d))
    return folder


@pytest.mark.parametrize("fmt", ["pickle", "json"])
@pytest.mark.parametrize("kind, expect", [
    ("healthy", []),
    ("straggler", [("missing", "0", 3, [0, 1], [2], {})]),
    ("mismatch", [("mismatch", "0", 3, [0, 1], [], {2: "gloo:broadcast [[16]] ['Float']"})]),
    ("size", [("mismatch", "0", 3, [0, 1], [], {2: "gloo:all_reduce [[8]] ['Float']"})]),
    ("cycle", [("missing", "0", 3, [0, 1], [2], {}), ("missing", "1", 2, [2], [0, 1], {})]),
])
def test_diagnose_synthetic(tmp_path, fmt, kind, expect):
    diag = flight.diagnose(write(tmp_path / "d", scenario(kind), fmt))
    got = [(f.kind, f.group, f.seq_id, f.reached, f.missing, f.mismatched) for f in diag.findings]
    assert got == expect
    assert diag.healthy == (kind == "healthy")
    if kind == "straggler":
        assert diag.position[2] == "not in a collective"
        assert "take their stacks" in diag.verdict()
    if kind == "cycle":
        assert diag.cycle == ["0:default_pg", "1:metrics", "0:default_pg"]


def test_json_status_as_strings(tmp_path):
    """torch's JSON dump (`fr_trace_json`, chapter 2.5) writes pg_status sequence ids as strings."""
    dumps = scenario("straggler")
    for d in dumps.values():
        d["pg_status"] = {k: {f: str(v) for f, v in st.items()} for k, st in d["pg_status"].items()}
    diag = flight.diagnose(write(tmp_path / "d", dumps, "json"))
    assert [(f.kind, f.seq_id, f.missing) for f in diag.findings] == [("missing", 3, [2])]
    assert flight.load_dump(tmp_path / "d" / "rank_0.json").pg_status == {
        k: {f: int(v) for f, v in st.items()} for k, st in dumps[0]["pg_status"].items()}


def test_truncated_ring_buffer(tmp_path):
    """With only the newest entries kept, pg_status still gives each rank's last sequence id."""
    dumps = scenario("cycle")
    for d in dumps.values():
        d["entries"] = d["entries"][-2:]
    diag = flight.diagnose(write(tmp_path / "d", dumps))
    assert [(f.group, f.seq_id, f.missing) for f in diag.findings] == [("0", 3, [2]), ("1", 2, [0, 1])]


def test_repair_makes_the_analyzer_work(tmp_path, caplog):
    fr_trace = pytest.importorskip("torch.distributed.flight_recorder.fr_trace")
    raw = write(tmp_path / "raw", scenario("cycle"))
    with pytest.raises(KeyError), contextlib.redirect_stdout(io.StringIO()):
        fr_trace.main([str(raw)])
    fixes = flight.write_repaired(raw, tmp_path / "fixed")
    assert any("keyed by ''" in f for f in fixes) and any("1:metrics" in f for f in fixes)
    fixed = pickle.loads((tmp_path / "fixed" / "rank_0").read_bytes())
    assert fixed["pg_config"] == {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"},
                                  "1": {"name": "1", "desc": "metrics", "ranks": "[0, 1, 2]"}}
    caplog.set_level("INFO")
    with contextlib.redirect_stdout(io.StringIO()):
        fr_trace.main([str(tmp_path / "fixed")])
    assert "missing ranks: {2}" in caplog.text


def test_nccl_layout_needs_no_repair(tmp_path):
    dumps = scenario("straggler")
    for d in dumps.values():
        d["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"}}
        for e in d["entries"]:
            e["profiling_name"] = e["profiling_name"].replace("gloo:", "nccl:")
            e["state"] = "completed" if e["collective_seq_id"] <= 2 else "scheduled"
        del d["pg_status"]
    diag = flight.diagnose(write(tmp_path / "d", dumps))
    assert diag.repaired == []
    assert [(f.op, f.missing) for f in diag.findings] == [("nccl:all_reduce", [2])]


@pytest.mark.parametrize("make, message", [
    (lambda d: None, "is empty"),
    (lambda d: (d / "rank_0").write_bytes(pickle.dumps(scenario("healthy")[0])[:-40]), "truncated or corrupt"),
    (lambda d: (d / "rank_0").write_bytes(b""), "empty file"),
    (lambda d: (d / "rank_0").write_bytes(pickle.dumps({"hello": 1})), "not a flight-recorder dump"),
    (lambda d: (d / "notes").write_bytes(pickle.dumps(scenario("healthy")[0])), "cannot tell the rank"),
    (lambda d: [write(d, scenario("healthy")), write(d, scenario("healthy"), "json")], "two dumps for rank"),
])
def test_bad_input(tmp_path, make, message):
    d = tmp_path / "dumps"
    d.mkdir()
    make(d)
    with pytest.raises(DumpError, match=message):
        flight.load_dumps(d)


def test_not_a_folder(tmp_path):
    with pytest.raises(DumpError, match="is not a folder"):
        flight.diagnose(tmp_path / "nope")


def test_mixed_jobs(tmp_path):
    a, b = scenario("straggler"), scenario("straggler")
    for e in b[2]["entries"]:
        e["time_created_ns"] += 3600 * 10**9  # rank 2 from a run one hour later
    write(tmp_path / "d", {0: a[0], 1: a[1], 2: b[2]})
    with pytest.raises(DumpError, match="mixed dumps"):
        flight.load_dumps(tmp_path / "d")


def test_incomplete(tmp_path):
    dumps = scenario("straggler")
    del dumps[2]
    write(tmp_path / "d", dumps)
    with pytest.raises(DumpError, match=r"no dump from rank\(s\) \[2\]"):
        flight.load_dumps(tmp_path / "d")
    diag = flight.diagnose(tmp_path / "d", allow_incomplete=True)
    assert diag.ranks == [0, 1] and diag.findings[0].missing == [2]
    assert "no dump" in diag.findings[0].describe()


def test_cli(tmp_path, capsys):
    d = write(tmp_path / "d", scenario("mismatch"))
    assert flight.main([str(d), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["findings"][0]["mismatched"] == {"2": "gloo:broadcast [[16]] ['Float']"}
    assert flight.main([str(write(tmp_path / "h", scenario("healthy")))]) == 0
    assert flight.main([str(tmp_path / "empty")]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_timeline_rows(tmp_path):
    rows = flight.timeline(flight.load_dumps(write(tmp_path / "d", scenario("straggler"))))
    assert len(rows) == 3 + 3 + 2
    assert {(r["rank"], r["seq"]) for r in rows if not r["completed"]} == {(0, 3), (1, 3)}
    assert min(r["t"] for r in rows) == 0.0


HANG = textwrap.dedent('''
    import os, time
    from datetime import timedelta
    import torch, torch.distributed as dist
    import torch._C._distributed_c10d as c10d
    from torch.distributed import _watchdog
    os.environ["TORCH_FR_DUMP_TEMP_FILE"] = os.path.join(os.environ["DUMPS"], "rank_")
    dist.init_process_group("gloo", timeout=timedelta(seconds=4))
    rank = dist.get_rank()
    for _ in range(2):
        dist.all_reduce(torch.ones(8))
    h = _watchdog.cpu_timeout(1.0, lambda: c10d._dump_fr_trace_file(rank, includeStackTraces=False))
    if rank == 1:
        time.sleep(2.5)          # the straggler: never joins the third all_reduce
    else:
        try:
            dist.all_reduce(torch.ones(8))
        except RuntimeError:
            pass
    os._exit(0)
''')


def test_live_gloo_hang(tmp_path):
    """A real 2-rank hang: both ranks dump through the watchdog; diagnose() names the straggler."""
    from pt215.launch import run

    script = tmp_path / "hang.py"
    script.write_text(HANG)
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    run(script, 2, timeout=50, env={"DUMPS": str(dumps)}, stream=False, show=False)
    assert sorted(p.name for p in dumps.iterdir()) == ["rank_0", "rank_1"]
    diag = flight.diagnose(dumps)
    assert [(f.group, f.seq_id, f.op, f.reached, f.missing) for f in diag.findings] == [
        ("0", 3, "gloo:all_reduce", [0], [1])]
    assert diag.position[1] == "not in a collective"
