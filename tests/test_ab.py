"""`python -m pt215.ab`: two settings of one torchrun job, interleaved and compared; a failing arm is reported."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from pt215 import ab

GLOO_JOB = """
import os
import torch
import torch.distributed as dist
from pt215.launch import init_rank, shutdown

me = init_rank("gloo")
scale = float(os.environ.get("AB_SCALE", "1"))
for step in range(3):
    t = torch.tensor([scale * (me.rank + 1) * (step + 1)])
    dist.all_reduce(t)
    if me.rank == 0:
        print(f"step {step} loss {t.item():.3f}", flush=True)
shutdown()
"""

PLAIN_JOB = """
import os
if os.environ.get("AB_FAIL") == os.environ["RANK"]:
    raise SystemExit("broken on purpose in this arm")
print("step 0 loss 1.0", flush=True)
"""


def job(tmp_path: Path, name: str, body: str) -> str:
    p = tmp_path / f"{name}.py"
    p.write_text(textwrap.dedent(body))
    return str(p)


@pytest.mark.slow
def test_two_arms_on_gloo_interleaved_with_their_metrics(tmp_path, unique_name):
    a, b = ab.parse_arm("A", "", 2), ab.parse_arm("B", "AB_SCALE=2", 2)
    c = ab.compare(job(tmp_path, unique_name, GLOO_JOB), a, b, reps=2, metric=r"loss (?P<loss>[\d.]+)")
    assert [r.arm for r in c.runs] == ["A", "B", "B", "A"]  # alternating, so drift hits both arms alike
    assert all(r.error is None for r in c.runs)
    assert c.pooled("A")["loss"] == [3.0, 6.0, 9.0] * 2 and c.pooled("B")["loss"] == [6.0, 12.0, 18.0] * 2
    table = ab.format_table(c, mask=("wall_s",))
    assert "loss" in table and "2.000" in table.splitlines()[2] and "FAILED" not in table


def test_a_failing_arm_is_reported_not_averaged(tmp_path, unique_name, capsys):
    path = job(tmp_path, unique_name, PLAIN_JOB)
    code = ab.main([path, "--nproc", "2", "--reps", "1", "--b", "AB_FAIL=1", "--metric", r"loss (?P<loss>[\d.]+)"])
    out = capsys.readouterr().out
    assert code == 1
    assert "FAILED: arm B, rep 1: rank 1 exited with 1: broken on purpose in this arm (arm B not averaged)" in out
    loss_row = next(line for line in out.splitlines() if line.startswith("loss"))
    assert "n/a" in loss_row and "1.000 (1.000-1.000)" in loss_row
    c = ab.compare(path, ab.Arm("A"), ab.Arm("B", {"AB_FAIL": "0"}), reps=1, metric=r"accuracy (?P<acc>[\d.]+)")
    assert [r.error for r in c.runs] == ["rank 0 printed no line the --metric pattern matches",
                                         "rank 0 exited with 1: broken on purpose in this arm"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--nproc", "2", "--b-nproc", "4"], "different world sizes (A: 2 ranks, B: 4 ranks)"),
    (["--a", "NOT-A-NAME=1"], "--a: 'NOT-A-NAME=1' is not KEY=VALUE"),
    (["--b", "JUSTAWORD"], "--b: 'JUSTAWORD' is not KEY=VALUE"),
    (["--reps", "0"], "reps must be an int >= 1"),
    (["--metric", "loss ([0-9]+)"], "metric needs named groups"),
    (["--metric", "loss (?P<x"], "metric is not a regular expression"),
])
def test_bad_input_is_refused_before_anything_runs(tmp_path, argv, message, capsys):
    path = job(tmp_path, "never_run", "raise SystemExit('must not run')\n")
    assert ab.main([path, *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_missing_job_is_named(tmp_path, capsys):
    assert ab.main([str(tmp_path / "nope.py")]) == 2
    assert "nope.py" in capsys.readouterr().err


def test_env_from_script_takes_the_literal_exports(tmp_path):
    script = tmp_path / "launch.sh"
    script.write_text("#!/bin/bash\nexport A=1\nexport B=\"two words\"\nexport C='x y'  # quoted\n"
                      "export D=$HOME/fr\nexport E=`date`\n  export F=x # trailing comment\nG=not-exported\n"
                      "# export H=commented\n")
    assert ab.env_from_script(script) == {"A": "1", "B": "two words", "C": "x y", "F": "x"}
    with pytest.raises(FileNotFoundError, match="no launch script"):
        ab.env_from_script(tmp_path / "missing.sh")


def _comparison(loss_b: list[float] | None, error: str | None = None) -> ab.Comparison:
    a = [ab.RunOutcome("A", 0, 10.0, {"loss": [2.83861, 2.83861], "bytes": [156992.0]}),
         ab.RunOutcome("A", 1, 12.0, {"loss": [2.83861], "bytes": [156992.0]})]
    b = [ab.RunOutcome("B", 0, 11.0, {"loss": loss_b or [], "bytes": [313984.0]}, error)]
    return ab.Comparison((ab.Arm("A"), ab.Arm("B")), [a[0], b[0], a[1]])


def test_table_digits_per_metric_and_marks_for_kernel_dependent_values():
    c = _comparison([2.83894])
    table = ab.format_table(c, digits={"loss": 4, "bytes": 0}, mask=("wall_s",), approx=("loss",))
    rows = {line.split()[0]: line for line in table.splitlines()}
    assert "≈2.8386 (≈2.8386-≈2.8386)" in rows["loss"] and rows["loss"].endswith("≈1.000")
    assert "156992 (156992-156992)" in rows["bytes"] and rows["bytes"].endswith("2.000")
    assert rows["wall_s"].split()[1:] == ["~", "~", "~"]
    assert "interleaved (A B A)" in table
    assert c.median("A", "bytes") == 156992 and c.ratio("bytes") == 2.0
    with pytest.raises(ValueError, match="digits must be an int >= 0"):
        ab.format_table(c, digits={"loss": -1})


def test_a_failed_arm_has_no_median():
    c = _comparison(None, error="rank 1 exited with 2: bad flag")
    with pytest.raises(ValueError, match="arm B has failed runs; its values are not averaged"):
        c.median("B", "loss")
    with pytest.raises(ValueError, match="arm A has no samples of 'flips'"):
        c.median("A", "flips")
    assert "FAILED: arm B, rep 1: rank 1 exited with 2: bad flag (arm B not averaged)" in ab.format_table(c)


def test_arms_need_ranks(tmp_path):
    path = job(tmp_path, "never_run", "raise SystemExit('must not run')\n")
    with pytest.raises(ValueError, match="arm A needs nproc >= 1 ranks, got 0"):
        ab.compare(path, ab.Arm("A", nproc=0), ab.Arm("B", nproc=0))


def test_arms_from_launch_scripts_and_quoted_arguments(tmp_path, unique_name, capsys):
    (tmp_path / "old.sh").write_text("export AB_SCALE=1\n")
    (tmp_path / "new.sh").write_text("export AB_SCALE=3\n")
    body = PLAIN_JOB.replace('print("step 0 loss 1.0", flush=True)',
                             'import sys\nprint(f"step 0 loss {float(os.environ[\'AB_SCALE\']):.1f} {sys.argv[1:]}",'
                             ' flush=True)')
    path = job(tmp_path, unique_name, body)
    code = ab.main([path, "--nproc", "1", "--reps", "1", "--a-env-from", str(tmp_path / "old.sh"),
                    "--b-env-from", str(tmp_path / "new.sh"), "--b-args", "--name 'two words'",
                    "--metric", r"loss (?P<loss>[\d.]+)"])
    out = capsys.readouterr().out
    assert code == 0, out
    loss_row = next(line for line in out.splitlines() if line.startswith("loss"))
    assert "1.000 (1.000-1.000)" in loss_row and "3.000 (3.000-3.000)" in loss_row
    assert ab.main([path, "--a-env-from", str(tmp_path / "none.sh")]) == 2
    assert "no launch script" in capsys.readouterr().err
