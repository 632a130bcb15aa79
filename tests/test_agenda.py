"""`pt215.agenda` (Running a workshop): the timetable generated from the notebooks' recorded run times."""

from __future__ import annotations

import json

import pytest

from pt215.agenda import CUTS, Chapter, Notebook, minutes, read_notebooks, schedule


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
    assert s.rows[0].clock == "09:00" and s.rows[0].kind == "chapter"


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


def test_an_unverified_notebook_is_scheduled_and_noted():
    s = schedule([Chapter("chapters/09/index", "9", (nb("chapters/09/09-1", seconds=None),))], "day")
    assert placed(s) == ["chapters/09/09-1"] and "not yet verified" in s.notes[0]


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
