"""Every chapter page follows one template, links the scripts it runs, and shows the pt215 code it teaches.

The template (level-2 headings, in this order; a chapter adds its own sections between "The idea" and
"Key points"): Objectives, Notebooks, The idea, Key points, Exercises, Troubleshooting, Measured results,
References. Code is shown from the source with `literalinclude` and `:pyobject:`, so page and package cannot
drift; this test checks that each named object exists before Sphinx does.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(ROOT.glob("chapters/[0-9][0-9]-*/index.md"))
TEMPLATE = ["Objectives", "Notebooks", "The idea", "Key points", "Exercises", "Troubleshooting",
            "Measured results", "References"]
#: The teaching frame (CONTRIBUTING, "The teaching frame"), for the chapters listed in tests/framed.txt.
FRAME = ["Why it matters", "Objectives", "Notebooks", "The idea", "In your own job", "Key points", "Exercises",
         "Troubleshooting", "References"]
FRAMED = {line.strip() for line in (ROOT / "tests" / "framed.txt").read_text().splitlines()
          if line.strip() and not line.startswith("#")}
INCLUDE = re.compile(r"```\{literalinclude\}\s+(\S+)\n((?::[^\n]*\n)*)")


def _id(p: Path) -> str:
    return p.parent.name


def _headings(text: str) -> list[str]:
    body = re.sub(r"```.*?```", "", text, flags=re.S)
    return [m.group(1).strip() for m in re.finditer(r"^## (.+)$", body, flags=re.M)]


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_page_follows_the_template(page: Path):
    heads = _headings(page.read_text(encoding="utf-8"))
    template = FRAME if page.parent.name in FRAMED else TEMPLATE
    found = [h for h in heads if h in template]
    assert found == template, f"{_id(page)}: template headings {found}, expected {template} in this order"


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_first_mention_of_each_script_is_a_link(page: Path):
    text = page.read_text(encoding="utf-8")
    for script in sorted(page.parent.glob("*.py")):
        if script.name == "conftest.py":
            continue
        i = text.find(script.name)
        if i < 0:
            continue  # a script the page does not mention
        link = f"[`{script.name}`]({script.name})"
        assert text.find(link) == i - 2, f"{_id(page)}: the first mention of {script.name} must be {link}"


def _objects(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
            if isinstance(node, ast.ClassDef):
                names |= {f"{node.name}.{n.name}" for n in node.body if isinstance(n, ast.FunctionDef)}
    return names


@pytest.mark.parametrize("page", [p for p in PAGES if not p.parent.name.startswith("00-")], ids=_id)
def test_page_shows_the_pt215_code_it_teaches(page: Path):
    text = page.read_text(encoding="utf-8")
    shown = 0
    for m in INCLUDE.finditer(text):
        target = (page.parent / m.group(1)).resolve()
        assert target.is_file(), f"{_id(page)}: literalinclude of a missing file {m.group(1)}"
        opts = dict(re.findall(r":(\w+):\s*(.*)", m.group(2)))
        if "pyobject" in opts:
            assert opts["pyobject"] in _objects(target), \
                f"{_id(page)}: {m.group(1)} has no object {opts['pyobject']}"
            shown += "src/pt215/" in target.as_posix()
    assert shown, f"{_id(page)}: show at least one pt215 function from the source (literalinclude :pyobject:)"
