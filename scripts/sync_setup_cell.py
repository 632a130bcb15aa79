"""Write the setup cell (install `pt215` when missing) as the first code cell of every chapter notebook.

    .venv/bin/python scripts/sync_setup_cell.py            # after changing repository.url/install in _config.yml
    .venv/bin/python scripts/sync_setup_cell.py --check    # exit 1 if a notebook's first code cell is out of date

The cell's text comes from `pt215.site.config.setup_cell_source` and `_config.yml`; it is written into both the
MyST source (.md) and the reference notebook (.ipynb, with no output: the cell prints nothing when pt215 is
installed), so no notebook needs re-executing.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import jupytext
import nbformat

from pt215.site.config import SETUP_CELL_MARKER, read_book_config, setup_cell_source

ROOT = Path(__file__).resolve().parents[1]
TAGS = ["hide-input"]
_CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(.*?)^```[ \t]*\n", re.S | re.M)


def md_block(source: str) -> str:
    return "```{code-cell} ipython3\n:tags: [" + ", ".join(TAGS) + "]\n\n" + source + "\n```\n"


def sync_md(path: Path, source: str) -> bool:
    """Put the setup cell right under the notebook's title (replacing an older copy wherever it stands)."""
    text = path.read_text(encoding="utf-8")
    m = _CELL.search(text)
    if m is None:
        raise SystemExit(f"sync_setup_cell: {path} has no code cell")
    body = text
    if SETUP_CELL_MARKER in m.group(1):
        body = text[: m.start()] + text[m.end():].lstrip("\n")
    title = re.search(r"^# .*\n", body, re.M)
    if title is None:
        raise SystemExit(f"sync_setup_cell: {path} has no '# N.M Title' heading")
    new = body[: title.end()] + "\n" + md_block(source) + body[title.end():]
    if new != text:
        path.write_text(new, encoding="utf-8")
        return True
    return False


def sync_ipynb(md: Path, nb_path: Path) -> bool:
    """Update the reference notebook's inputs from its source, keeping the outputs of unchanged cells (what
    `jupytext --to ipynb --update` does); the setup cell itself has no output."""
    from jupytext.combine import combine_inputs_with_outputs

    old = nbformat.read(nb_path, as_version=4)
    new = jupytext.read(md)
    new = combine_inputs_with_outputs(new, old, fmt="md:myst")  # returns the combined notebook (jupytext 1.19)
    before = {(c.cell_type, c.source): c for c in old.cells}
    for cell in new.cells:  # keep ids and execution counts of unchanged cells, so nothing else is rewritten
        prev = before.get((cell.cell_type, cell.source))
        if prev is not None:
            cell.id = prev.get("id", cell.id)
            if cell.cell_type == "code":
                cell.execution_count = prev.get("execution_count")
    meta = dict(old.metadata)  # keep what regen.py wrote (pt215.verified); take the rest from the source
    for key, value in new.metadata.items():
        if key == "pt215":
            meta["pt215"] = {**(old.metadata.get("pt215") or {}), **value}
        elif key != "jupytext":
            meta[key] = value
    new.metadata = meta
    for cell in new.cells:
        if cell.cell_type == "code" and SETUP_CELL_MARKER in cell.source:
            cell.outputs = []
            cell.execution_count = cell.execution_count or 0
    if nbformat.writes(new) == nbformat.writes(old):
        return False
    nbformat.write(new, nb_path)
    return True


def first_code_source(path: Path) -> str:
    m = _CELL.search(path.read_text(encoding="utf-8"))
    if m is None:
        return ""
    body = m.group(1)
    return re.sub(r"\A:tags:[^\n]*\n\n", "", body).rstrip("\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="only report notebooks whose setup cell is out of date")
    a = p.parse_args(argv)
    source = setup_cell_source(read_book_config(ROOT).install_source)
    sources = sorted(ROOT.glob("chapters/*/[0-9]*.md"))
    stale = [s for s in sources if first_code_source(s) != source]
    if a.check:
        for s in stale:
            print(f"{s.relative_to(ROOT)}: setup cell out of date (run scripts/sync_setup_cell.py)")
        return 1 if stale else 0
    for s in sources:
        changed = sync_md(s, source)
        nb = s.with_suffix(".ipynb")
        if nb.is_file():
            changed |= sync_ipynb(s, nb)
        if changed:
            print(f"{s.relative_to(ROOT)}: setup cell written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
