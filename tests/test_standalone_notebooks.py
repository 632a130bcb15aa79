"""A notebook opened on its own runs: pt215 installed from its wheel into a fresh environment, the notebook alone
in an empty folder (what a download from the website, Colab or Binder gives a reader).

The notebooks marked `pt215: standalone: true` in their front matter are executed here under nbval (strict, with
the book's sanitizer) instead of in the main run (chapters/conftest.py skips them there), so each notebook still
runs once. One of them, `tests/test_download.py`'s notebook, is executed by that test instead: from the book's zip,
alone in an empty folder, its setup cell installing pt215 from the wheel beside it (the same check, one step
closer to a reader's download). The fresh environment gets the wheel; torch and the other dependencies come from
the book's .venv through a path entry (an install of torch would take minutes), never the editable checkout of
pt215.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]


ZIP_NOTEBOOK = ROOT / "chapters/00-before-you-start/00-1-environment.ipynb"  # run by tests/test_download.py


def marked_standalone() -> list[Path]:
    return [p for p in sorted(ROOT.glob("chapters/*/[0-9]*.ipynb"))
            if (nbformat.read(p, as_version=4).metadata.get("pt215") or {}).get("standalone")]


def standalone_notebooks() -> list[Path]:
    """The standalone notebooks this file runs: all but the one the zip test runs."""
    return [p for p in marked_standalone() if p != ZIP_NOTEBOOK]


@pytest.fixture(scope="module")
def fresh_env(tmp_path_factory) -> Path:
    """A new venv with pt215 installed from a freshly built wheel; returns its python."""
    tmp = tmp_path_factory.mktemp("standalone")
    wheels = tmp / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(wheels), str(ROOT)], check=True, timeout=300)
    (wheel,) = wheels.glob("pt215-*.whl")
    env = tmp / "env"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, timeout=120)
    py = env / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)],
                   check=True, timeout=300)
    site = Path(subprocess.check_output([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        text=True).strip())
    # torch, nbval, ipykernel ... from the book's environment; its .pth files (the editable pt215) are not read.
    (site / "book_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return py


def test_the_wheel_carries_scripts_and_data(fresh_env: Path, tmp_path: Path):
    code = ("import pt215.book_files as b, pt215.model as m; "
            "print(b.book_root().name, b.chapter_script('hello.py').name, "
            "b.data_path('05-nvfp4-decoding/lm-dense.pt').name, m.DATA_DIR.is_dir(), b.__file__)")
    out = subprocess.check_output([str(fresh_env), "-c", code], cwd=tmp_path, text=True, timeout=120).split()
    assert out[:4] == ["_book", "hello.py", "lm-dense.pt", "True"]
    assert str(ROOT / "src") not in out[4], "pt215 came from the checkout, not from the wheel"


def test_some_notebooks_are_marked_standalone():
    names = {p.parent.name for p in marked_standalone()}
    assert {"00-before-you-start", "02-flight-recorder", "05-nvfp4-decoding"} <= names


def test_the_zip_tests_notebook_is_standalone_and_runs_once():
    import test_download

    assert ROOT / test_download.NOTEBOOK == ZIP_NOTEBOOK and ZIP_NOTEBOOK in marked_standalone()
    assert ZIP_NOTEBOOK not in standalone_notebooks()


@pytest.mark.parametrize("nb", standalone_notebooks(), ids=lambda p: p.name)
def test_notebook_runs_alone_in_an_empty_folder(nb: Path, fresh_env: Path, tmp_path: Path):
    shutil.copy(nb, tmp_path / nb.name)
    proc = subprocess.run(
        [str(fresh_env), "-m", "pytest", "-q", "--no-header", "-p", "no:cacheprovider", "--nbval",
         "--nbval-current-env", "--nbval-cell-timeout=900", "--nbval-sanitize-with", str(ROOT / "tests/sanitize.cfg"),
         "--rootdir", str(tmp_path), nb.name],
        cwd=tmp_path, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
