"""pt215.evidence.glue: a value recorded as myst-nb records it, and a page that names a missing one fails -W."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest
from IPython.core.interactiveshell import InteractiveShell

from pt215.evidence import GLUE_PREFIX, glue


def _captured(code: str) -> list[dict]:
    shell = InteractiveShell.instance()
    outputs: list[dict] = []
    shell.display_pub.publish = lambda data, metadata=None, **kw: outputs.append(  # type: ignore[method-assign]
        {"data": data, "metadata": metadata or {}})
    shell.run_cell(code, store_history=False)
    return outputs


def test_glue_records_the_value_under_its_name_without_showing_it():
    out = _captured("from pt215.evidence import glue\nglue('write_gbps', '0.63 GB/s')")
    assert out == [{"data": {GLUE_PREFIX + "text/plain": "'0.63 GB/s'"},
                    "metadata": {"scrapbook": {"name": "write_gbps", "mime_prefix": GLUE_PREFIX}}}]


@pytest.mark.parametrize("name, value, message", [
    ("Write", 1.0, "name must be lower-case"), ("1x", 1.0, "name must be lower-case"),
    ("ok", [1], "value must be a str, int or float"), ("ok", True, "value must be a str, int or float"),
    ("ok", float("inf"), "value must be finite"),
])
def test_bad_input_names_the_argument(name, value, message):
    with pytest.raises(ValueError, match=message):
        glue(name, value)


def _book(root: Path, page: str) -> subprocess.CompletedProcess:
    tmp, out = root / "src", root / "out"
    tmp.mkdir(parents=True)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Notebook"),
                                         nbformat.v4.new_code_cell("glue")])
    nb.cells[1].outputs = [nbformat.v4.new_output(
        "display_data", data={GLUE_PREFIX + "text/plain": "'0.63 GB/s'"},
        metadata={"scrapbook": {"name": "write_gbps", "mime_prefix": GLUE_PREFIX}})]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp / "nb.ipynb")
    (tmp / "index.md").write_text("# Page\n\n" + page + "\n\n```{toctree}\nnb\n```\n", encoding="utf-8")
    (tmp / "conf.py").write_text(textwrap.dedent("""
        extensions = ["myst_nb"]
        nb_execution_mode = "off"
        exclude_patterns = ["_build"]
    """), encoding="utf-8")
    return subprocess.run([sys.executable, "-m", "sphinx", "-W", "-q", "-b", "html", str(tmp), str(out)],
                          capture_output=True, text=True, timeout=180)


@pytest.mark.slow
def test_a_page_that_names_a_missing_glue_value_fails_the_build(tmp_path: Path):
    """The book's own build (README command 1) shows the glued values; here, one wrong name must stop it."""
    bad = _book(tmp_path, "Write ran at {glue:text}`nb.ipynb::read_gbps:s`.")
    assert bad.returncode != 0 and "read_gbps" in bad.stderr, bad.stderr[-2000:]
