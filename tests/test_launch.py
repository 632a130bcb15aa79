"""pt215.launch: multi-rank runs from a cell, with every child gone afterwards (chapter 0)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pt215.launch import LaunchTimeoutError, RankFailedError, report, run, running_processes

OK = """
import torch, torch.distributed as dist
from pt215.launch import report
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank())])
dist.all_reduce(t)
print(f"rank {dist.get_rank()} sum {t.item():.0f}")
report({"rank": dist.get_rank(), "sum": t.item()})
dist.destroy_process_group()
"""

FAIL = """
import os
print("working", flush=True)
if os.environ["RANK"] == "2":
    raise RuntimeError("boom on purpose")
"""

HANG = """
import os, time
print("up", os.environ["RANK"], flush=True)
if os.environ["RANK"] == "1":
    while True:
        time.sleep(1)
"""

HANG_ALL_IGNORING_TERM = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("up", flush=True)
while True:
    time.sleep(1)
"""


def script(tmp_path: Path, name: str, body: str) -> Path:
    p = tmp_path / f"{name}.py"
    p.write_text(textwrap.dedent(body))
    return p


def wait_gone(marker: str, seconds: float = 10.0) -> int:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        n = running_processes(marker)
        if n == 0:
            return 0
        time.sleep(0.2)
    return running_processes(marker)


@pytest.mark.slow
def test_success_returns_per_rank_results(tmp_path, unique_name, capsys):
    res = run(script(tmp_path, unique_name, OK), nproc=3, timeout=120, stream=False)
    assert res.returncode == 0
    assert res.results == {r: {"rank": r, "sum": 3.0} for r in range(3)}
    assert res.stdout[1] == ["rank 1 sum 3"]
    out = capsys.readouterr().out.splitlines()
    assert out == [f"[rank{r}] rank {r} sum 3" for r in range(3)]  # grouped by rank, in order
    assert wait_gone(unique_name) == 0


@pytest.mark.slow
def test_failing_rank_is_named_with_its_last_output(tmp_path, unique_name):
    with pytest.raises(RankFailedError) as info:
        run(script(tmp_path, unique_name, FAIL), nproc=3, timeout=120, stream=False, show=False)
    err = info.value
    assert err.rank == 2 and err.exitcode == 1
    assert any("boom on purpose" in line for line in err.last_output)
    assert "rank 2" in str(err) and "boom on purpose" in str(err)
    assert wait_gone(unique_name) == 0


@pytest.mark.slow
def test_hang_ends_at_timeout_and_leaves_no_process(tmp_path, unique_name):
    start = time.monotonic()
    with pytest.raises(LaunchTimeoutError) as info:
        run(script(tmp_path, unique_name, HANG), nproc=2, timeout=6, stream=False, show=False)
    took = time.monotonic() - start
    assert took < 6 + 15  # timeout plus bounded cleanup
    assert "did not finish within 6 s" in str(info.value)
    assert info.value.killed >= 1
    assert wait_gone(unique_name) == 0


@pytest.mark.slow
def test_processes_ignoring_sigterm_are_killed(tmp_path, unique_name):
    with pytest.raises(LaunchTimeoutError):
        run(script(tmp_path, unique_name, HANG_ALL_IGNORING_TERM), nproc=2, timeout=6, stream=False, show=False)
    assert wait_gone(unique_name) == 0


@pytest.mark.slow
def test_interrupt_cleans_up(tmp_path, unique_name):
    path = script(tmp_path, unique_name, HANG)
    # SIGINT as a notebook kernel receives it: default disposition, even when this suite runs from a shell that
    # started it in the background (which ignores SIGINT for its children)
    driver = subprocess.Popen(
        [sys.executable, "-c", f"from pt215.launch import run; run({str(path)!r}, nproc=2, timeout=300)"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 90
        while running_processes(unique_name) < 3 and time.monotonic() < deadline:  # launcher + 2 ranks
            time.sleep(0.2)
        assert running_processes(unique_name) >= 3, "ranks never started"
        driver.send_signal(signal.SIGINT)  # what the notebook's interrupt button sends
        driver.wait(timeout=30)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert wait_gone(unique_name) == 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"nproc": 0}, "nproc must be a positive int"),
        ({"nproc": "2"}, "nproc must be a positive int"),
        ({"timeout": 0}, "timeout must be a positive number"),
        ({"args": "--x"}, "args must be a list of strings"),
        ({"args": [1]}, "args must be a list of strings"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, match):
    path = script(tmp_path, "ok", OK)
    with pytest.raises(ValueError, match=match):
        run(path, **kwargs)


def test_missing_script(tmp_path):
    with pytest.raises(FileNotFoundError, match="not_there.py"):
        run("not_there.py", cwd=tmp_path)


def test_report_outside_the_launcher_is_a_no_op(monkeypatch, tmp_path):
    monkeypatch.delenv("PT215_RESULT_DIR", raising=False)
    assert report({"a": 1}) == {"a": 1}
    monkeypatch.setenv("PT215_RESULT_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "3")
    report({"b": 2})
    assert (tmp_path / "rank3.json").read_text() == '{"b": 2}'
    assert not list(tmp_path.glob(".*tmp"))


def test_cli_help():
    out = subprocess.run([sys.executable, "-m", "pt215.launch", "--help"], capture_output=True, text=True,
                         timeout=60, env={**os.environ})
    assert out.returncode == 0 and "--nproc" in out.stdout


@pytest.mark.slow
@pytest.mark.parametrize("order", ["before", "after"])
def test_cli_options_before_or_after_the_script(tmp_path, unique_name, order):
    path = script(tmp_path, unique_name, OK)
    opts = ["-n", "2", "--timeout", "120"]
    argv = opts + [str(path)] if order == "before" else [str(path)] + opts
    out = subprocess.run([sys.executable, "-m", "pt215.launch", *argv], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == '{"0": {"rank": 0, "sum": 1.0}, "1": {"rank": 1, "sum": 1.0}}'


FLAKY = """
import os, pathlib, sys
marker = pathlib.Path(sys.argv[1])
print("attempt", "second" if marker.exists() else "first", flush=True)
if os.environ["RANK"] == "1" and not marker.exists():
    marker.write_text("failed once")
    sys.exit(7)
"""


@pytest.mark.slow
def test_retries_relaunch_after_a_failed_rank(tmp_path, unique_name, capsys):
    path = script(tmp_path, unique_name, FLAKY)
    with pytest.raises(RankFailedError) as info:
        run(path, nproc=2, timeout=120, args=[str(tmp_path / "m0")], stream=False, show=False)
    assert info.value.rank == 1 and info.value.exitcode == 7
    res = run(path, nproc=2, timeout=120, args=[str(tmp_path / "m1")], stream=False, retries=1)
    assert res.stdout == {0: ["attempt second"], 1: ["attempt second"]}
    assert capsys.readouterr().out.splitlines() == ["[rank0] attempt second", "[rank1] attempt second"]
    with pytest.raises(ValueError, match="retries must be an int >= 0"):
        run(path, retries=-1)
    assert wait_gone(unique_name) == 0
