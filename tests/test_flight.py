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
        assert "take the stack" in diag.verdict()
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
    files = [os.path.join(os.environ["DUMPS"], f"rank_{r}") for r in range(2)]
    if rank == 0:
        try:
            dist.all_reduce(torch.ones(8))
        except RuntimeError:
            pass
    deadline = time.monotonic() + 30  # the straggler never joins the third all_reduce; both leave once both dumped
    while not all(os.path.exists(f) for f in files) and time.monotonic() < deadline:
        time.sleep(0.05)
    os._exit(0)
''')


def test_live_gloo_hang(tmp_path):
    """A real 2-rank hang: both ranks dump through the watchdog; diagnose() names the straggler."""
    from pt215.launch import run

    script = tmp_path / "hang.py"
    script.write_text(HANG)
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    run(script, 2, timeout=120, env={"DUMPS": str(dumps)}, stream=False, show=False)
    assert sorted(p.name for p in dumps.iterdir()) == ["rank_0", "rank_1"]
    diag = flight.diagnose(dumps)
    assert [(f.group, f.seq_id, f.op, f.reached, f.missing) for f in diag.findings] == [
        ("0", 3, "gloo:all_reduce", [0], [1])]
    assert diag.position[1] == "not in a collective"


# ---------------------------------------------------------------- chapter 2's additions: scale, silence, frames

# hang_lab.py on 4 ranks, with these arguments, wrote data/02-flight-recorder/mystery
MYSTERY = ["--case", "order", "--culprit", "1", "--stacks"]


def test_rank_ranges():
    assert flight.rank_ranges([0, 1, 2, 3, 5, 7, 8]) == "0-3, 5, 7, 8"
    assert flight.rank_ranges([3, 1, 2, 2]) == "1-3"
    assert flight.rank_ranges([]) == "none"


def test_a_silent_rank_is_named_not_blamed(tmp_path):
    """A rank whose recorder was off writes a dump with nothing in it: left out of the comparison, and named."""
    dumps = scenario("straggler")
    dumps[1] = {"version": "2.10", "entries": [], "pg_config": {}, "pg_status": {}, "comm_lib_version": ""}
    diag = flight.diagnose(write(tmp_path / "d", dumps))
    assert diag.silent == [1] and "recorded nothing" in diag.position[1]
    assert [(f.seq_id, f.reached, f.missing) for f in diag.findings] == [(3, [0], [2])]
    assert "rank 1 recorded nothing" in diag.verdict()


def test_a_silent_culprit_is_the_only_suspect(tmp_path):
    dumps = scenario("straggler")
    dumps[2] = {"version": "2.10", "entries": [], "pg_config": {}, "pg_status": {}, "comm_lib_version": ""}
    diag = flight.diagnose(write(tmp_path / "d", dumps))
    assert [(f.seq_id, f.reached, f.missing) for f in diag.findings] == [(3, [0, 1], [2])]
    assert "recorded nothing" in diag.findings[0].where[2]


def test_frames_name_the_line_that_issued_the_collective(tmp_path):
    dumps = scenario("straggler")
    for r in (0, 1):
        dumps[r]["entries"][-1]["frames"] = [
            {"name": "all_reduce", "filename": "/venv/lib/python3.11/site-packages/torch/distributed/x.py", "line": 9},
            {"name": "train_step", "filename": "/home/me/train.py", "line": 42}]
    diag = flight.diagnose(write(tmp_path / "d", dumps))
    assert diag.position[0].endswith("issued at train.py:42 in train_step")
    assert flight.user_frame({"frames": []}) is None


def test_a_cycle_names_the_lone_rank_of_the_smallest_group(tmp_path):
    diag = flight.diagnose(write(tmp_path / "d", scenario("cycle")))
    assert diag.suspects == [2] and "suspect: rank 2" in diag.verdict()
    assert flight.diagnose(write(tmp_path / "s", scenario("straggler"))).suspects == []


def test_a_thousand_ranks_fire_drill(tmp_path):
    planted = flight.write_synthetic_job(tmp_path / "job", world=256, tp=8, steps=4, culprit=77)
    diag = flight.diagnose(tmp_path / "job")
    assert diag.suspects == [77] and planted["peers"] == [72, 73, 74, 75, 76, 78, 79]
    where = diag.by_position()
    assert [len(r) for r in where.values()] == [249, 7]
    assert "ranks 72-76, 78, 79 missing" in diag.summary()
    assert diag.summary().count("\n") < 12  # grouped: the summary does not grow with the ranks


@pytest.mark.parametrize("kwargs, message", [
    ({"world": 10, "tp": 4}, "multiple of tp"), ({"world": 1}, "world must be"), ({"culprit": 99, "world": 16},
                                                                                   "culprit must be")])
def test_synthetic_job_bad_input(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        flight.write_synthetic_job(tmp_path, **({"tp": 4} | kwargs))


def test_mixed_jobs_found_in_one_pass(tmp_path):
    """The same-job check is linear in the entries: 256 ranks load quickly, and a late rank is still caught."""
    flight.write_synthetic_job(tmp_path / "job", world=256, tp=8, steps=3, culprit=5)
    late = pickle.loads((tmp_path / "job" / "rank_200").read_bytes())
    for e in late["entries"]:
        e["time_created_ns"] += 3600 * 10**9
    (tmp_path / "job" / "rank_200").write_bytes(pickle.dumps(late))
    with pytest.raises(DumpError, match="rank_200"):
        flight.load_dumps(tmp_path / "job")


def test_apply_rank_env(monkeypatch):
    monkeypatch.delenv("PT215_X", raising=False)
    assert flight.apply_rank_env(["1:PT215_X=a=b", "0:PT215_Y=c"], rank=1) == {"PT215_X": "a=b"}
    import os

    assert os.environ["PT215_X"] == "a=b" and "PT215_Y" not in os.environ
    with pytest.raises(ValueError, match="RANK:NAME=VALUE"):
        flight.apply_rank_env(["PT215_X=1"], rank=0)
    with pytest.raises(ValueError, match="list of"):
        flight.apply_rank_env("0:PT215_X=1", rank=0)


def test_the_legacy_backend_reads_only_the_legacy_names():
    """The claim of chapter 2's settings: the recorder reads TORCH_FR_* first; nccl-legacy only the old three."""
    torch = pytest.importorskip("torch")
    include = Path(torch.__file__).parent / "include" / "torch" / "csrc" / "distributed" / "c10d"
    recorder = flight.cvar_names((include / "FlightRecorder.hpp").read_text())
    legacy = flight.cvar_names((include / "ProcessGroupNCCL.hpp").read_text())
    assert recorder["TORCH_FR_BUFFER_SIZE"] == ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
    assert recorder["TORCH_FR_DUMP_ON_TIMEOUT"] == ("TORCH_FR_DUMP_ON_TIMEOUT", "TORCH_NCCL_DUMP_ON_TIMEOUT")
    for name in flight.LEGACY_ONLY:
        assert legacy[name] == (name,)
    with pytest.raises(ValueError, match="header's text"):
        flight.cvar_names(include)


def test_settled_trace_waits_for_the_completions(tmp_path):
    """In a fresh process: the flight recorder is one per process and keeps a group's status after the group is
    destroyed, so an earlier test's default group would show its own count here."""
    import subprocess
    import sys

    code = (
        "import torch, torch.distributed as dist, pytest\n"
        "from pt215 import flight\n"
        "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
        "for _ in range(3):\n"
        "    dist.all_reduce(torch.ones(4))\n"
        "trace = flight.settled_trace(includeStackTraces=False)\n"
        "assert trace['pg_status']['0']['last_completed_collective'] == 3, trace['pg_status']\n"
        "with pytest.raises(ValueError, match='timeout_s'):\n"
        "    flight.settled_trace(timeout_s=0)\n"
        "dist.destroy_process_group()\n"
        "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-2000:]


def test_the_figures_draw(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, _ = flight.plot_triage_tree()
    plt.close(fig)
    flight.write_synthetic_job(tmp_path / "job", world=64, tp=8, steps=2, culprit=3)
    ax = flight.plot_wait_for(flight.diagnose(tmp_path / "job"))
    assert any("ranks" in t.get_text() for t in ax.texts)  # grouped nodes for a job of 64
    plt.close(ax.figure)
    with pytest.raises(ValueError, match="triples"):
        flight.plot_triage_tree([("a", "b")])


def test_the_mystery_is_answerable_from_what_ships():
    """The shipped dumps name, in their frames, the line of hang_lab.py the culprit's stuck entry came from, and
    that line of the shipped script is the metrics all_reduce inside the order case's culprit branch."""
    from pt215.book_files import chapter_script, data_path

    diag = flight.diagnose(data_path("02-flight-recorder/mystery"))
    assert diag.suspects == [1]
    lines = chapter_script("hang_lab.py").read_text().splitlines()
    for r, d in flight.load_dumps(data_path("02-flight-recorder/mystery")).items():
        for e in d.entries:
            for f in e["frames"]:
                assert not Path(f["filename"]).is_absolute(), f  # no machine's folders in the shipped files
                if f["filename"] == "hang_lab.py":  # each frame of the script is still at its call
                    calls = {"main": ("dist.", "healthy_step()"), "healthy_step": ("dist.",),
                             "<module>": ("main()",)}[f["name"]]
                    assert any(c in lines[f["line"] - 1] for c in calls), (
                        r, f, "hang_lab.py changed under the mystery: re-record it with " + " ".join(MYSTERY))
    stuck = flight.load_dumps(data_path("02-flight-recorder/mystery"))[1].entries[-1]
    line = next(f["line"] for f in stuck["frames"] if f["filename"] == "hang_lab.py" and f["name"] == "main")
    context = "\n".join(lines[line - 3:line + 1])
    assert 'a.case == "order"' in context and "if is_culprit:" in context, context
    assert "all_reduce(stats, group=metrics)" in lines[line - 1]
