"""`pt215.verify.boundary`: every command a notebook launches runs on CPU up to its first hardware call (issue 24)."""

from __future__ import annotations

import psutil
import pytest

from pt215.verify import boundary

NOTEBOOK = "chapters/02-flight-recorder/02-9-planted.md"  # a notebook source placed next to debug_server.py


def _cell(code: str) -> str:
    return f"# planted\n\n```{{code-cell}} ipython3\nfrom pt215.launch import run\n{code}\n```\n"


def test_commands_are_derived_from_the_notebook_cells():
    cmds = boundary.commands()
    shells = [c.shell() for c in cmds]
    assert len(cmds) >= 40
    # a loop over literals, a helper's call sites and a temporary folder are all resolved
    assert sum("eager_init.py" in s for s in shells) == 3
    assert any("hang_lab.py --case straggler --dump-dir '<tmp>/straggler'" in s for s in shells)
    assert any("debug_server.py" in s and "--backend nccl" in s for s in shells)
    assert not any("{tmp}" in s for s in shells)


def test_every_launched_command_reaches_the_boundary():
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    outcomes = boundary.run_all(timeout=60)
    bad = [boundary.format_outcome(o) for o in outcomes if not o.ok]
    assert not bad, "\n".join(bad)
    assert sum(o.status == "boundary" for o in outcomes) >= 40
    nccl = [o for o in outcomes if "--backend" in o.command.args and "nccl" in o.command.args]
    assert nccl and all(o.detail.startswith("torch.cuda.set_device") for o in nccl), [o.detail for o in nccl]
    after = {p.pid for p in psutil.Process().children(recursive=True)}
    assert after <= before, f"processes left behind: {sorted(after - before)}"


def test_a_planted_argument_error_fails_before_the_boundary():
    # 2.5's first NCCL2 cell had this shape: on gloo the straggler must arrive before the timeout
    cmds = boundary.extract(_cell('run("debug_server.py", 2, args=["--timeout", "10", "--stuck", "30"], '
                                  'timeout=60)'), NOTEBOOK)
    assert [c.where for c in cmds] == [f"{NOTEBOOK}:5"]
    out = boundary.run_one(cmds[0], timeout=60)
    assert out.status == "failed" and not out.ok
    assert "exited with code 2" in out.detail and "--stuck (30.0) < --timeout (10.0)" in out.detail


def test_an_unknown_option_and_a_missing_script_fail():
    cmds = boundary.extract(_cell('for b in ("gloo", "bogus"):\n    run("debug_server.py", 2, args=["--backend", b])'
                                  '\nrun("no_such_script.py", 2)'), NOTEBOOK)
    assert [c.args for c in cmds] == [("--backend", "gloo"), ("--backend", "bogus"), ()]
    ok, bad, missing = (boundary.run_one(c, timeout=60) for c in cmds)
    assert ok.status == "boundary" and ok.detail.startswith("init_process_group at debug_server.py:")
    assert bad.status == "failed" and "invalid choice: 'bogus'" in bad.detail
    assert missing.status == "failed" and "no_such_script.py" in missing.detail


def test_a_command_the_source_does_not_give_is_an_error():
    with pytest.raises(ValueError, match=r"02-9-planted.md:6: .*run-time value sys.argv"):
        boundary.extract(_cell('import sys\nrun("hang_lab.py", 2, args=sys.argv)'), NOTEBOOK)
    # a notebook's own function called run is not the launcher
    assert boundary.extract("```{code-cell} ipython3\ndef run(x):\n    return x\nrun(1)\n```\n", NOTEBOOK) == []


def test_a_hung_child_is_killed_by_pid():
    # hang.py's rank 1 sleeps forever before any hardware call: the bounded wait ends it by PID
    cmd = boundary.Command("chapters/00-before-you-start/00-9-x.md", 1, "hang.py", 2, (), (("RANK", "1"),))
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    out = boundary.run_one(cmd, timeout=3)
    assert out.status == "failed" and out.detail == "no hardware call within 3 s (killed)"
    assert "rank 1: stuck (sleeping forever)" in out.output
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before
