"""Teach first, prove underneath (CONTRIBUTING, "The teaching frame"): what every chapter page and notebook holds.

- A chapter page's first screen says why the change matters and gives the verdict table (`pt215.site.verdicts`);
  it shows a figure near its top (`{nb-figure}`), and it has the frame: objectives, prerequisites, "In your own
  job", key points, exercises, troubleshooting.
- No source-file citation with line numbers stands in running text: such proof goes in a collapsed block
  (an admonition with `:class: dropdown`) or on a chapter's appendix page.
- Every notebook has at least two exercises with collapsed solutions, and at least one figure.
- A notebook is referred to by its number N.M, never "notebook 02"; no stored output shows a progress bar's clock.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pt215.site.verdicts import read_verdicts, verdict_map_svg, verdict_table

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted(p for p in (ROOT / "chapters").glob("[0-9][0-9]-*") if p.is_dir())
NOTEBOOK_SOURCES = sorted((ROOT / "chapters").glob("[0-9][0-9]-*/[0-9][0-9]-*.md"))
PAGES = sorted([*(ROOT / "chapters").glob("*/*.md"), *(ROOT / "chapters").glob("*.md"), ROOT / "intro.md"])
#: The chapters rewritten in the frame (tests/framed.txt, one folder a line; a chapter joins when its page and
#: notebooks are): the frame's tests apply to these. The book is done when every chapter is listed.
FRAMED: set[str] = {line.strip() for line in (ROOT / "tests" / "framed.txt").read_text().splitlines()
                    if line.strip() and not line.startswith("#")}
FRAMED_CHAPTERS = [c for c in CHAPTERS if c.name in FRAMED]
FRAMED_NOTEBOOKS = [s for s in NOTEBOOK_SOURCES if s.parent.name in FRAMED]
FRAMED_PAGES = [p for p in PAGES if p.parent.name in FRAMED or p.parent in (ROOT, ROOT / "chapters")
                or p.parent.name == "workshop"]

#: A citation of a source file with line numbers: `FlightRecorder.hpp` L363-381, `stage.py` lines 702-705, x.py:45.
CITATION = re.compile(r"[\w/.-]+\.(?:py|pyi|hpp|h|cpp|cc|cu|cuh|yaml|yml|toml|cmake)`?\)?,?\s*"
                      r"(?:\(?L\d+|lines? \d+|:\d+)")
DROPDOWN_OPEN = re.compile(r"^(?P<fence>:{3,}|`{3,})\{(?:admonition|dropdown|note|tip|important|seealso)\}.*$")
HEADINGS = ("Objectives", "Prerequisites", "In your own job", "Key points", "Exercises", "Troubleshooting")
STALE_REF = re.compile(r"\bnotebooks? 0?\d\b(?!\.\d)")
PROGRESS_CLOCK = re.compile(r"\d+:\d\d<|\bit/s\b|\bs/it\b|s/(?:setting|model|it)\]|\d(?:\.\d+)?(?:it|s)/s\b")


def running_text(text: str) -> str:
    """The page without front matter, code blocks and collapsed (dropdown) blocks: what a reader reads first."""
    text = re.sub(r"\A---\n.*?\n---\n", "", text, flags=re.S)
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = DROPDOWN_OPEN.match(lines[i].strip())
        code = re.match(r"^(`{3,}|~{3,})", lines[i].strip())
        if m or code:
            fence = (m.group("fence") if m else code.group(1))
            block = [lines[i]]
            j = i + 1
            while j < len(lines) and lines[j].strip() != fence:
                block.append(lines[j])
                j += 1
            body = "\n".join(block)
            collapsed = m is not None and (":class: dropdown" in body or lines[i].strip().startswith(
                f"{fence}{{dropdown}}"))
            if m and not collapsed:  # an open admonition is running text; its nested blocks are judged in turn
                out.extend(running_text("\n".join(block[1:])).splitlines())
            i = j + 1
            continue
        out.append(lines[i])
        i += 1
    return "\n".join(out)


def test_running_text_drops_code_and_dropdowns_but_keeps_open_admonitions():
    page = ("Intro `a.py` L3\n```python\nx.py:4\n```\n:::{admonition} How we know\n:class: dropdown\n"
            "stage.py lines 702-705\n:::\n:::{tip}\nkept.py L9\n:::\n")
    text = running_text(page)
    assert "x.py:4" not in text and "stage.py" not in text and "kept.py L9" in text and "a.py` L3" in text
    assert CITATION.findall(text) == ["a.py` L3", "kept.py L9"]


def test_framed_names_real_chapters():
    assert FRAMED <= {c.name for c in CHAPTERS}


def test_every_chapter_is_in_the_frame():
    """Every chapter is held to the frame: a new chapter joins tests/framed.txt when it lands."""
    assert {c.name for c in CHAPTERS} - FRAMED == set(), "add the chapter's folder to tests/framed.txt"


@pytest.mark.parametrize("chapter", FRAMED_CHAPTERS, ids=lambda p: p.name)
def test_first_screen_says_why_and_gives_the_verdict(chapter):
    text = (chapter / "index.md").read_text(encoding="utf-8")
    h2 = re.findall(r"^## (.+)$", text, flags=re.M)
    assert h2 and h2[0].strip() == "Why it matters", f"{chapter.name}: the first section must be 'Why it matters'"
    assert read_verdicts(chapter / "index.md")
    first = text.split("\n## ", 3)
    assert "{nb-figure}" in "\n## ".join(first[:3]), f"{chapter.name}: show a figure near the top ({{nb-figure}})"
    missing = [h for h in HEADINGS if not re.search(rf"^##+ {re.escape(h)}\b", text, flags=re.M)]
    assert missing == [], f"{chapter.name}: the page lacks {missing}"


@pytest.mark.parametrize("page", FRAMED_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_source_line_citation_in_running_text(page):
    if page.name == "appendix.md" or page.name.endswith("-appendix.md"):
        pytest.skip("an appendix page holds the proof")
    found = CITATION.findall(running_text(page.read_text(encoding="utf-8")))
    assert found == [], f"move these into a 'How we know' dropdown or the appendix: {found[:8]}"


@pytest.mark.parametrize("source", FRAMED_NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_has_exercises_with_collapsed_solutions_and_a_figure(source):
    text = source.read_text(encoding="utf-8")
    exercises = re.findall(r"^:{3,}\{admonition\} Exercise \d+\.\d+\.\d+", text, flags=re.M)
    solutions = re.findall(r"^:{3,}\{admonition\} Solution[^\n]*\n:class: dropdown", text, flags=re.M)
    assert len(exercises) >= 2, f"{source.name}: {len(exercises)} exercises (at least 2, 'Exercise N.M.k')"
    assert len(solutions) >= len(exercises), f"{source.name}: every exercise needs a collapsed solution"
    assert "show(" in text, f"{source.name}: no figure (end a plotting cell with pt215.figures.show)"


def test_the_verdicts_gather_into_one_table(tmp_path):
    for name in ("01-a", "02-b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "index.md").write_text(
            "## Why it matters\n\n| Feature | What it buys | What it costs or risks | Verdict | Rollback |\n"
            f"|---|---|---|---|---|\n| f{name} | b | c | **test first** | r |\n\n## Next\n")
    table = verdict_table(tmp_path).splitlines()
    assert table[2] == "| [1](01-a/index.md) | f01-a | b | **test first** | r |" and len(table) == 4


def test_the_verdict_map_draws_every_row(tmp_path):
    """{verdict-map}: one square per verdict row, coloured by its verdict, and the counts in the alt text."""
    for name, verdicts in (("01-a", ("test first", "adopt now")), ("02-b", ("leave alone",))):
        (tmp_path / name).mkdir()
        rows = "".join(f"| f{k} | b | c | **{v}** | r |\n" for k, v in enumerate(verdicts))
        (tmp_path / name / "index.md").write_text(
            f"# {int(name[:2])}. Chapter {name}: a subtitle\n\n## Why it matters\n\n"
            "| Feature | What it buys | What it costs or risks | Verdict | Rollback |\n|---|---|---|---|---|\n"
            f"{rows}\n## Next\n")
    svg, alt, counts = verdict_map_svg(tmp_path)
    assert counts == {"adopt now": 1, "test first": 1, "leave alone": 1}
    assert svg.count('rx="4"') == 3 and "Chapter 01-a</text>" in svg and "subtitle" not in svg
    assert "3 features, 1 adopt now (green), 1 test first (orange), 1 leave alone (grey)" in alt


def test_a_bad_verdict_table_is_named(tmp_path):
    page = tmp_path / "01-x" / "index.md"
    page.parent.mkdir()
    page.write_text("## Why it matters\n\n| Feature | What it buys | What it costs or risks | Verdict | Rollback |\n"
                    "|---|---|---|---|---|\n| a | b | c | maybe | d |\n")
    with pytest.raises(ValueError, match="'maybe' is not one of adopt now, test first, leave alone"):
        read_verdicts(page)
    page.write_text("no table\n")
    with pytest.raises(ValueError, match="no verdict table"):
        read_verdicts(page)


@pytest.mark.parametrize("page", FRAMED_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_notebooks_are_named_by_their_number(page):
    text = re.sub(r"`[^`\n]*`", " ", page.read_text(encoding="utf-8"))
    assert STALE_REF.findall(text) == [], f"{page.name}: refer to a notebook as N.M (e.g. 'notebook 2.3')"


@pytest.mark.parametrize("nb", [s.with_suffix(".ipynb") for s in FRAMED_NOTEBOOKS], ids=lambda p: p.name)
def test_no_stored_progress_bar_clock(nb):
    cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
    texts = ["".join(o.get("text", "")) + json.dumps(o.get("data", {}))
             for c in cells if c["cell_type"] == "code" for o in c.get("outputs", [])]
    bad = [m.group(0) for t in texts for m in PROGRESS_CLOCK.finditer(t)]
    assert bad == [], f"{nb.name}: a stored progress bar shows its clock ({bad[:3]}); use pt215's bar without one"


def test_gathered_verdicts_keep_their_glue_and_links(tmp_path):
    """A verdict cell's glue reference and relative links are the chapter folder's; gathered one folder up they must
    still resolve (a glue name with no folder fails the at-a-glance page's -W build)."""
    (tmp_path / "03-x").mkdir()
    (tmp_path / "03-x" / "index.md").write_text(
        "## Why it matters\n\n| Feature | What it buys | What it costs or risks | Verdict | Rollback |\n"
        "|---|---|---|---|---|\n| f | {glue:text}`03-1-a.ipynb::v:s` faster ([3.1](03-1-a.ipynb)) | c | adopt now | "
        "[chapter 7](../07-y/index.md), [web](https://example.org/a) |\n")
    row = verdict_table(tmp_path).splitlines()[2]
    assert "{glue:text}`03-x/03-1-a.ipynb::v:s`" in row and "[3.1](03-x/03-1-a.ipynb)" in row
    assert "[chapter 7](07-y/index.md)" in row and "[web](https://example.org/a)" in row
