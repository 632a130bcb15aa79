"""Every figure a chapter page quotes is bound to its evidence (CONTRIBUTING, "Figures bound to evidence").

A figure is a number with a unit of measure (ms, GB/s, %, ×, MB, ...) in a page's prose. It is bound when it is
glued from a notebook ({glue:text}), printed with its unit in one of the chapter's stored outputs, written in a
results file under the chapter's data/ folder, or listed in the page's front matter under `pt215: not_measured`
with where it comes from (a datasheet, the release notes, arithmetic on other figures).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([*ROOT.glob("chapters/*/index.md"), *ROOT.glob("chapters/*/install.md"), *ROOT.glob("chapters/*.md"),
                ROOT / "intro.md"])

UNITS = (r"ms|µs|us|ns|s|min|GB/s|MB/s|GiB/s|MiB/s|TB/s|Gbit/s|Gb/s|TFLOP/s|GFLOP/s|tokens/s|tok/s|M el/s|"
         r"GB|MB|KB|kB|KiB|MiB|GiB|TB|B|%|×|x")
NUMBER = r"[-−+]?(?:\d{1,3}(?:[ ,\u202f]\d{3})+|\d+)(?:\.\d+)?"
FIGURE = re.compile(r"(?<![\w.^/-])(" + NUMBER + r")\s?(" + UNITS + r")(?![\w/])")


def prose(text: str) -> str:
    """The page without front matter, code, math, glue roles, inline code and link targets."""
    text = re.sub(r"\A---\n.*?\n---\n", "", text, flags=re.S)
    for pattern in (r"(`{3,}|~{3,}).*?\1", r"\$\$.*?\$\$", r"\{glue(?::\w+)?\}`[^`]*`", r"\{[\w:-]+\}`[^`]*`",
                    r"`[^`\n]*`", r"\$[^$\n]+\$", r"\]\([^)]*\)", r"<[^>\n]+>"):
        text = re.sub(pattern, " ", text, flags=re.S)
    return text


def figures(text: str) -> list[str]:
    return [f"{_digits(num)} {unit}" for num, unit in FIGURE.findall(prose(text))]


def _digits(num: str) -> str:
    return re.sub(r"[ ,\u202f]", "", num).replace("−", "-")


def _norm(text: str) -> str:
    """Minus signs as '-', no thousands separators, one space between a number and its unit."""
    text = re.sub(r"(?<=\d)[,\u202f](?=\d{3}\b)", "", text.replace("−", "-"))
    return re.sub(r"(\d)\s?(?=[^\d\s.,])", r"\1 ", text)


def evidence(chapter: Path) -> str:
    """Stored outputs of the chapter's notebooks and its data/ files, figures spaced as `figures` spaces them."""
    parts = []
    for nb in sorted(chapter.glob("[0-9]*.ipynb")):
        for cell in nbformat.read(nb, as_version=4).cells:
            for out in cell.get("outputs", []):
                parts.append(out.get("text", ""))
                parts.extend(str(v) for k, v in out.get("data", {}).items() if k.endswith("text/plain"))
    data = ROOT / "data" / chapter.name
    if data.is_dir():
        parts += [f.read_text(errors="ignore") for f in sorted(data.rglob("*"))
                  if f.is_file() and f.suffix in {".json", ".csv", ".md", ".txt"}]
    return _norm("\n".join(parts))


def declared(text: str) -> dict[str, str]:
    m = re.match(r"\A---\n(.*?)\n---\n", text, flags=re.S)
    meta = (yaml.safe_load(m.group(1)) or {}) if m else {}
    return {(_norm(str(k))): str(v) for k, v in ((meta.get("pt215") or {}).get("not_measured") or {}).items()}


def unbound(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    ev, decl = evidence(page.parent), declared(text)
    missing = []
    for fig in figures(text):
        num, unit = fig.split(" ", 1)
        if fig in decl or re.search(r"(?<![\d.])" + re.escape(num.lstrip("+")) + r"\s?" + re.escape(unit), ev):
            continue
        missing.append(fig)
    return sorted(set(missing))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_figure_on_the_page_is_bound_to_evidence(page: Path):
    missing = unbound(page)
    assert not missing, (f"{page.relative_to(ROOT)} quotes figures found in no stored output of its chapter, no "
                         f"data/{page.parent.name}/ file and not under `pt215: not_measured`: {missing}. Glue them "
                         f"from the notebook that measures them ({{glue:text}}`NN-M-x.ipynb::name:s`).")


def test_the_check_finds_a_typed_figure_and_accepts_a_glued_one(tmp_path: Path):
    ch = tmp_path / "chapters" / "09-x"
    ch.mkdir(parents=True)
    page = ch / "index.md"
    page.write_text("---\npt215:\n  not_measured:\n    '800 GB/s': M3 Ultra datasheet\n---\n"
                    "# 9\nAt 800 GB/s the write ran at 0.97 GB/s, {glue:text}`09-1-x.ipynb::w:s` glued.\n"
                    "```python\nx = '5 ms'\n```\n", encoding="utf-8")
    assert unbound(page) == ["0.97 GB/s"]


def test_figures_are_read_with_their_units():
    assert figures("busbw 0.414 GB/s, 24.0 %, −10.1 %, 27 ns and 1.32–1.34× but not v2.15 or sm_90") == [
        "0.414 GB/s", "24.0 %", "-10.1 %", "27 ns", "1.34 ×"]
    assert json.dumps(figures("$2^{-7}\\approx 0.0078$ and `5 ms`")) == "[]"
    assert figures("313 984 B and 156,992 B") == ["313984 B", "156992 B"]
