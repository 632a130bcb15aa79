"""The whole book as one download (scripts/build_download.py, made by the website build): the zip holds every
notebook, the chapter scripts, data/, requirements.txt, the pt215 wheel and a README; unpacked in an empty folder
with a fresh virtual environment, a chapter notebook installs pt215 from the wheel by itself and runs.

The fresh environment sees torch and the notebooks' other packages through a path entry to the book's .venv (an
install of torch would download gigabytes); pt215 itself comes only from the zip's wheel, installed by the
notebook's own setup cell.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import build_download  # noqa: E402

from pt215.site.config import SETUP_CELL_MARKER, setup_cell_source  # noqa: E402

ZIP = ROOT / "_build" / "html" / "_downloads" / build_download.ZIP_NAME
NOTEBOOK = "chapters/00-before-you-start/00-1-environment.ipynb"


def test_setup_cell_is_replaced_in_a_notebook():
    nb = {"cells": [{"cell_type": "markdown", "source": "# T"},
                    {"cell_type": "code", "source": SETUP_CELL_MARKER + " old", "outputs": [{"x": 1}]},
                    {"cell_type": "code", "source": "print(1)", "outputs": []}], "metadata": {}}
    out = json.loads(build_download.with_setup_cell(json.dumps(nb).encode(), "NEW", SETUP_CELL_MARKER))
    assert out["cells"][1]["source"] == "NEW" and out["cells"][1]["outputs"] == []
    assert out["cells"][2]["source"] == "print(1)"


def test_setup_cell_prefers_the_wheel_beside_the_notebook():
    src = setup_cell_source("pt215 @ git+https://example.test/r.git@main")
    assert 'glob.glob("../../pt215-*.whl")' in src and "_wheels[-1] if _wheels else PT215_SOURCE" in src
    compile(src, "setup-cell", "exec")


@pytest.mark.slow
@pytest.mark.site
def test_zip_unpacked_in_an_empty_folder_runs_a_notebook(tmp_path: Path):
    if not ZIP.is_file():
        pytest.fail("the book's zip is not built: run README command 1 (jupyter-book build . -W) first")
    with zipfile.ZipFile(ZIP) as zf:
        names = set(zf.namelist())
        zf.extractall(tmp_path)
    book = tmp_path / build_download.TOP
    top = {n.split("/", 2)[1] for n in names}
    assert {"README.md", "requirements.txt", "chapters", "data"} <= top
    (wheel,) = book.glob("pt215-*.whl")
    notebooks = {p.relative_to(ROOT).as_posix() for p in ROOT.glob("chapters/*/[0-9]*.ipynb")}
    scripts = {p.relative_to(ROOT).as_posix() for p in ROOT.glob("chapters/*/*.py")}
    assert notebooks | scripts <= {n.split("/", 1)[1] for n in names}
    for nb in book.glob("chapters/*/[0-9]*.ipynb"):  # each first code cell is the current setup cell
        first = next(c for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code")
        assert "".join(first["source"]) == setup_cell_source(
            build_download.read_install_source(ROOT)), nb.name

    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, timeout=120)
    py = env / "bin" / "python"
    site = Path(subprocess.check_output([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        text=True).strip())
    # torch, nbval, ipykernel ... from the book's environment; its .pth files (the editable pt215) are not read.
    (site / "book_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    assert subprocess.run([str(py), "-c", "import pt215"], cwd=tmp_path, capture_output=True).returncode != 0
    nb = book / NOTEBOOK
    proc = subprocess.run(
        [str(py), "-m", "pytest", "-q", "--no-header", "-p", "no:cacheprovider", "--nbval", "--nbval-current-env",
         "--nbval-cell-timeout=600", "--nbval-sanitize-with", str(ROOT / "tests/sanitize.cfg"),
         "--rootdir", str(nb.parent), nb.name],
        cwd=nb.parent, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    where = subprocess.check_output([str(py), "-c", "import pt215; print(pt215.__file__)"], cwd=tmp_path, text=True)
    assert where.startswith(str(site)), f"pt215 did not come from the zip's wheel: {where}"
    assert wheel.name.startswith("pt215-")
