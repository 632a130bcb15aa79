"""`pt215.site.agenda` (Running a workshop): the timetable generated from the notebooks, the measured run times with
N participants at once, and the facilitator notes."""

from __future__ import annotations

import json

import pytest

from pt215.site import agenda
from pt215.site.agenda import (
    BUFFER_MIN,
    CUTS,
    Chapter,
    Exercise,
    Notebook,
    load_run_times,
    minutes,
    read_notebooks,
    read_notes,
    schedule,
)


def nb(doc: str, seconds: float | None = 60.0, words: int = 600, cells: int = 8) -> Notebook:
    return Notebook(doc, doc.rsplit("/", 1)[-1], seconds, words, cells)


def book(n_chapters: int, per_chapter: int, **kw) -> list[Chapter]:
    return [Chapter(f"chapters/{c:02d}/index", f"Chapter {c}",
                    tuple(nb(f"chapters/{c:02d}/{c:02d}-{i}", **kw) for i in range(1, per_chapter + 1)))
            for c in range(n_chapters)]


def placed(s) -> list[str]:
    return [r.doc for r in s.rows + s.later if r.kind in ("live", "read", "later")]


def test_minutes_grow_with_run_time_and_reading():
    short, long_ = nb("a", seconds=10), nb("a", seconds=600)
    assert minutes(long_, live=True) > minutes(short, live=True)
    assert minutes(nb("a", words=3000), live=False) > minutes(nb("a", words=300), live=False)
    assert minutes(long_, live=False) < minutes(long_, live=True)
    assert all(minutes(nb("a", seconds=s), live=True) % 5 == 0 for s in (1, 59, 61, 200))


def test_a_small_book_is_all_live_and_fits():
    s = schedule(book(2, 2), "day")
    assert s.fits and s.count("live") == 4 and s.count("read") == 0 and not s.later
    assert s.rows[0].clock == "09:00" and s.rows[0].kind == "setup" and "pt215.doctor" in s.rows[0].title
    assert s.rows[1].kind == "chapter"


def test_every_notebook_is_placed_once_in_order_and_breaks_come_between_items():
    chapters = book(7, 3, seconds=150, words=900)
    for cut in CUTS:
        s = schedule(chapters, cut)
        want = [n.doc for c in chapters for n in c.notebooks]
        assert sorted(placed(s)) == sorted(want) and len(placed(s)) == len(want)
        in_room = [r.doc for r in s.rows if r.kind in ("live", "read")]
        assert in_room == [d for d in want if d in in_room]  # book order
        times = [(r.start, r.start + r.minutes) for r in s.rows]
        assert all(a[1] == b[0] for a, b in zip(times, times[1:], strict=False))  # contiguous, no overlap


def test_overrun_downgrades_later_notebooks_first():
    chapters = book(7, 3, seconds=300, words=1500)
    day = schedule(chapters, "day")
    firsts = {c.notebooks[0].doc for c in chapters}
    modes = {r.doc: r.kind for r in day.rows + day.later if r.doc in firsts}
    assert set(modes.values()) == {"live"}  # first notebooks stay live while others can give way
    assert day.count("read") + day.count("later") > 0


def test_the_half_day_ends_by_half_past_twelve_and_lists_the_rest():
    s = schedule(book(7, 3, seconds=120), "half")
    assert s.fits and s.end <= CUTS["half"].blocks[-1][1] and s.later
    assert {r.kind for r in s.rows} >= {"break", "chapter", "live"}
    assert "Lunch" not in [r.title for r in s.rows]


def test_a_day_has_a_lunch_and_two_breaks_when_full():
    s = schedule(book(7, 3, seconds=150, words=900), "day")
    assert [r.title for r in s.rows if r.kind in ("break", "lunch")] == ["Break", "Lunch", "Break"]
    before = [s.rows[i - 1] for i, r in enumerate(s.rows) if r.kind in ("break", "lunch")]
    assert all(r.kind == "buffer" and r.minutes >= BUFFER_MIN for r in before)  # a buffer before every break


def test_an_unverified_notebook_is_scheduled_and_noted():
    s = schedule([Chapter("chapters/09/index", "9", (nb("chapters/09/09-1", seconds=None),))], "day")
    assert placed(s) == ["chapters/09/09-1"] and "measured nowhere" in s.notes[0]


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="cut must be one of day, half"):
        schedule(book(1, 1), "week")
    with pytest.raises(ValueError, match="chapters must be a non-empty list of Chapter"):
        schedule([], "day")


def test_read_notebooks_finds_titles_seconds_and_new_chapters(tmp_path):
    ch = tmp_path / "chapters" / "09-new"
    ch.mkdir(parents=True)
    (ch / "index.md").write_text("---\npt215: {needs: CPU}\n---\n\n# 9 A new chapter\n")
    cells = [{"cell_type": "markdown", "source": ["# 9.1 First\n", "Some words here.\n"]},
             {"cell_type": "code", "source": "print(1)", "outputs": []}]
    meta = {"pt215": {"verified": {"seconds": 42.5}}}
    (ch / "09-1-first.ipynb").write_text(json.dumps({"cells": cells, "metadata": meta}))
    (ch / "notes.md").write_text("# not a notebook\n")
    chapters = read_notebooks(tmp_path)
    assert [c.title for c in chapters] == ["9 A new chapter"]
    (n,) = chapters[0].notebooks
    assert (n.doc, n.title, n.seconds, n.code_cells) == ("chapters/09-new/09-1-first", "9.1 First", 42.5, 1)


def test_the_book_agenda_reaches_every_notebook(book_root):
    chapters = read_notebooks(book_root)
    want = sorted(str(p.relative_to(book_root).with_suffix("")) for p in book_root.glob("chapters/*/[0-9]*.ipynb"))
    for cut in CUTS:
        s = schedule(chapters, cut)
        assert sorted(placed(s)) == want
        assert all(r.minutes > 0 for r in s.rows + s.later)


# ---------------------------------------------------------------- a real day: setup, exercises, wrap-up, buffers


def test_a_day_has_setup_exercises_wrap_up_and_ends_with_a_buffer():
    chapters = [Chapter(c.doc, c.title, c.notebooks, Exercise(f"Exercise of {c.title}", 10)) for c in book(4, 2)]
    s = schedule(chapters, "day")
    kinds = [r.kind for r in s.rows]
    assert kinds[0] == "setup" and kinds[-2:] == ["wrapup", "buffer"]
    assert s.fits and s.end <= s.planned_end - BUFFER_MIN and s.rows[-1].start + s.rows[-1].minutes == s.planned_end
    exercises = [r for r in s.rows if r.kind == "exercise"]
    assert len(exercises) == 4 and all(r.minutes == 10 for r in exercises)
    # each exercise comes after its chapter's notebooks
    for c in chapters:
        i = next(i for i, r in enumerate(s.rows) if r.kind == "exercise" and r.title.endswith(c.title))
        assert all(i > j for j, r in enumerate(s.rows) if r.doc.startswith(c.doc.rsplit("/", 1)[0] + "/0"))


def test_a_chapters_opener_is_never_split_from_its_first_notebook():
    for seconds in (30, 200, 400, 900):
        chapters = book(6, 2, seconds=seconds, words=1200)
        for cut in CUTS:
            rows = schedule(chapters, cut).rows
            for i, r in enumerate(rows):
                if r.kind == "chapter":
                    assert rows[i + 1].kind in ("live", "read"), (cut, seconds, rows[i:i + 2])


def test_a_notebook_the_notes_keep_live_is_never_downgraded():
    chapters = book(7, 3, seconds=300, words=1500)
    keep = chapters[2].notebooks[1]
    chapters[2] = agenda.with_notebook(chapters[2], keep.doc, live_always=True)
    for cut in CUTS:
        s = schedule(chapters, cut)
        assert next(r.kind for r in s.rows + s.later if r.doc == keep.doc) == "live", cut


NOTES = """# Facilitator notes

## 0 Before you start

- **Run live, always.** 0.1: the report.
- **In the room, 5 min: The hardware matrix.** Everyone reads it.

## 2 The flight recorder hang lab

- **Run live, always.** 2.2 and 2.4: the core.
- **In the room, 10 min: Exercise 2, "Predict".** Predict.

## 3 No exercise here

- **Discuss.** Something.
"""


def test_read_notes_finds_exercise_slots_and_live_notebooks():
    notes = read_notes(NOTES)
    assert notes[0] == (Exercise("The hardware matrix", 5), ("0.1",))
    assert notes[2] == (Exercise('Exercise 2, "Predict"', 10), ("2.2", "2.4"))
    assert notes[3] == (None, ())


def _concurrent(root, rows, participants=6, cores=2):
    path = root / "data" / "workshop" / "concurrent-runs.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    prov = {"date": "2026-12-01", "participants": participants, "cores": cores}
    path.write_text(json.dumps({"provenance": prov, "notebooks": rows}))


def test_run_times_come_from_the_measurements(tmp_path):
    hub = tmp_path / "data" / "workshop" / "hub-sizing.json"
    hub.parent.mkdir(parents=True)
    hub.write_text(json.dumps({"provenance": {}, "notebooks": [
        {"notebook": "chapters/01-a/01-1-x.ipynb", "wall_s": 10.0},
        {"notebook": "chapters/01-a/01-2-y.ipynb", "wall_s": 20.0}]}))
    cond = {"load_average_1_5_15": [1.5, 1.0, 1.0]}
    _concurrent(tmp_path, [{"notebook": "chapters/01-a/01-1-x.ipynb", "median_wall_s": 40.0, "slowdown": 4.0,
                            "conditions_before": cond},
                           {"notebook": "chapters/01-a/01-9-z.ipynb", "median_wall_s": 25.0, "slowdown": 2.5,
                            "conditions_before": {"load_average_1_5_15": [3.0, 1.0, 1.0]}}])
    rt = load_run_times(tmp_path)
    assert rt.participants == 6 and rt.slowdown == 4.0  # the largest measured slowdown plans for the slow case
    assert rt.seconds("chapters/01-a/01-1-x", 5.0) == (40.0, "measured with 6 participants at once")
    assert rt.seconds("chapters/01-a/01-2-y", 5.0)[0] == 80.0  # alone x slowdown
    assert rt.seconds("chapters/01-a/01-3-new", 5.0)[0] == 20.0  # regen's record x slowdown
    assert rt.seconds("chapters/01-a/01-3-new", None) == (None, "")
    assert "6 participants at once on 2 cores" in rt.conditions and "load average 1.5 to 3 " in rt.conditions


def test_without_measurements_the_recorded_times_are_used(tmp_path):
    rt = load_run_times(tmp_path)
    assert rt.slowdown == 1.0 and rt.seconds("x", 12.0) == (12.0, "recorded by scripts/regen.py x 1")


def test_the_book_agenda_is_a_day(book_root):
    """The built one-day agenda: setup, exercises from the notes, the hang lab live, wrap-up, buffers,
    and run times that come from measurements."""
    chapters = read_notebooks(book_root)
    s = schedule(chapters, "day")
    kinds = {r.kind for r in s.rows}
    assert {"setup", "exercise", "wrapup", "buffer", "lunch"} <= kinds and s.fits
    hang = next(r for r in s.rows if r.doc.endswith("02-2-hang-lab"))
    assert hang.kind == "live"
    nbs = [nb for c in chapters for nb in c.notebooks]
    assert all(nb.how.startswith(("measured", "recorded")) for nb in nbs), [nb.how for nb in nbs]
    if (book_root / agenda.CONCURRENT_RUNS).is_file():
        assert any(nb.how.startswith("measured with") for nb in nbs)


def test_a_break_never_falls_between_a_chapters_last_notebook_and_its_exercise():
    for seconds in (30, 200, 600):
        chapters = [Chapter(c.doc, c.title, c.notebooks, Exercise("Ex", 10))
                    for c in book(6, 3, seconds=seconds, words=1000)]
        for cut in CUTS:
            rows = schedule(chapters, cut).rows
            for i, r in enumerate(rows):
                if r.kind == "exercise":
                    assert rows[i - 1].kind in ("live", "read"), (cut, seconds, rows[i - 1:i + 1])


def test_freed_time_is_filled_again():
    """After the downgrades, no notebook could be promoted one step and still fit."""
    chapters = book(7, 3, seconds=150, words=900)
    s = schedule(chapters, "day")
    assert s.fits and s.count("later") + s.count("read") > 0
    slack = sum(r.minutes for r in s.rows if r.kind == "buffer")
    smallest_step = min(minutes(n, False) for c in chapters for n in c.notebooks)
    assert slack < smallest_step + agenda.BUFFER_MIN * 4 + 60  # buffers and granularity, not a wasted hour


# ---------------------------------------------------------------- a day in two parts: the morning, then tracks


def test_the_morning_opens_with_setup_and_the_afternoon_ends_with_the_wrap_up():
    chapters = book(3, 2, seconds=60)
    morning, afternoon = schedule(chapters, "morning"), schedule(chapters, "afternoon")
    assert morning.rows[0].kind == "setup" and "wrapup" not in {r.kind for r in morning.rows}
    assert morning.rows[0].clock == "09:00" and morning.end <= CUTS["morning"].blocks[-1][1]
    assert afternoon.rows[0].kind == "chapter" and afternoon.rows[0].clock == "13:30"
    assert [r.kind for r in afternoon.rows][-2:] == ["wrapup", "buffer"] and afternoon.fits


def test_select_chapters_keeps_book_order_and_names_the_missing_ones():
    chapters = book(4, 1)  # folders 00 .. 03
    got, missing = agenda.select_chapters(chapters, ["03", "01", "11-capstone"])
    assert [c.doc for c in got] == ["chapters/01/index", "chapters/03/index"] and missing == ["11-capstone"]
    with pytest.raises(ValueError, match="folders must be a list of chapter folder names"):
        agenda.select_chapters(chapters, "01")


def test_the_book_tracks_fit_their_afternoon(book_root):
    chapters = read_notebooks(book_root)
    tracks = {"distributed": ["02-flight-recorder", "03-nixl-transfers", "08-pipeline-parallelism"],
              "serving": ["05-nvfp4-decoding", "06-fp8-mps"], "platform": ["07-upgrading", "09-native-code"]}
    for name, folders in tracks.items():
        got, missing = agenda.select_chapters(chapters, folders)
        assert not missing, name
        s = schedule(got, "afternoon")
        assert s.fits and s.rows[0].clock == "13:30", name
    got, missing = agenda.select_chapters(chapters, ["11-capstone"])
    if missing:
        pytest.skip("the capstone chapter is not in this checkout")
    for cut in ("morning", "half"):
        s = schedule(got, cut)
        assert s.fits and {r.kind for r in s.rows if r.doc.startswith("chapters/11-")} <= {"live", "chapter",
                                                                                           "exercise"}, cut
