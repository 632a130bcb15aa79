"""scripts/suite_times.py: per-file seconds from a `--durations=0` log, its closing line read with or without
pytest's border, and a failed run's times refused as a baseline."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import suite_times  # noqa: E402

LOG = """\
12.50s call     tests/test_a.py::test_one
0.50s setup    tests/test_a.py::test_one
3.00s call     chapters/01-x/01-1-y.ipynb::Cell 3
2.00s teardown chapters/01-x/01-1-y.ipynb::Cell 9
"""


def test_per_file_adds_setup_call_and_teardown_of_each_file():
    assert suite_times.per_file(LOG) == {"tests/test_a.py": 13.0, "chapters/01-x/01-1-y.ipynb": 5.0}


def test_the_closing_line_is_read_with_or_without_its_border():
    quiet = "2258 passed, 1 skipped, 2 warnings in 665.01s (0:11:05)"
    bordered = "==== 3 failed, 10 passed in 12.30s ===="
    assert suite_times.SUMMARY.search(quiet).group("s") == "665.01"
    assert suite_times.SUMMARY.search(bordered).group("text") == "3 failed, 10 passed"


def test_a_log_of_a_failed_run_prints_its_times_and_exits_1(tmp_path, capsys):
    log = tmp_path / "run.log"
    log.write_text(LOG + "1 failed, 3 passed in 20.00s\n")
    assert suite_times.main(["--log", str(log)]) == 1
    out, err = capsys.readouterr()
    assert "13.0" in out and "pytest: 1 failed, 3 passed in 20.00 s" in out and "not a baseline" in err
    log.write_text(LOG + "4 passed in 20.00s\n")
    assert suite_times.main(["--log", str(log)]) == 0


def test_a_missing_log_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        suite_times.main(["--log", str(tmp_path / "none.log")])
    assert "--log: no such file" in capsys.readouterr().err
