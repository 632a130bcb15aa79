"""The book runs where its readers are: launch buttons that point somewhere or nowhere, the setup cell, shipped
files found through pt215, CPU-independent digits, JupyterLab installed (see "Install and run")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pt215.book_config import (
    SETUP_CELL_MARKER,
    BookConfig,
    configure_launch_buttons,
    read_book_config,
    setup_cell_source,
)
from pt215.book_files import BookFilesError, chapter_script, data_path
from pt215.cpu_kernels import AVX2_ONLY, active_capability

ROOT = Path(__file__).resolve().parents[1]
THEME = {"use_repository_button": True, "repository_url": "https://github.com/o/r",
         "launch_buttons": {"binderhub_url": "https://mybinder.org", "colab_url": "https://colab.research.google.com",
                            "jupyterhub_url": "", "notebook_interface": "jupyterlab", "thebe": False}}


def test_no_url_means_no_button_that_points_nowhere():
    opts = configure_launch_buttons(THEME, BookConfig())
    assert opts["use_repository_button"] is False and opts["repository_url"] == ""
    assert not any(k.endswith("_url") for k in opts["launch_buttons"])


def test_url_without_hub_keeps_binder_and_colab_only():
    opts = configure_launch_buttons(THEME, BookConfig(repository_url="https://github.com/o/r"))
    assert opts["use_repository_button"] is True
    assert set(k for k in opts["launch_buttons"] if k.endswith("_url")) == {"binderhub_url", "colab_url"}


def test_a_team_hub_is_kept_when_set():
    theme = {**THEME, "launch_buttons": {**THEME["launch_buttons"], "jupyterhub_url": "https://hub.team.test"}}
    opts = configure_launch_buttons(theme, BookConfig("https://github.com/o/r", jupyterhub_url="https://hub.team.test"))
    assert opts["launch_buttons"]["jupyterhub_url"] == "https://hub.team.test"


def test_install_source_follows_the_repository():
    assert BookConfig().install_source == ""
    assert BookConfig("https://github.com/o/r/", "main").install_source == "pt215 @ git+https://github.com/o/r.git@main"
    assert BookConfig("https://github.com/o/r", install="pt215==0.1").install_source == "pt215==0.1"


def test_every_notebook_starts_with_the_current_setup_cell():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts/sync_setup_cell.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_setup_cell_without_pt215_prints_one_line_not_a_traceback(tmp_path: Path):
    """Where pt215 is missing and cannot be installed, the cell says what to install, in one line."""
    cell = setup_cell_source("")  # no install source: nothing to pip install
    code = (
        "import sys\n"
        "sys.meta_path = [f for f in sys.meta_path if 'editable' not in getattr(f, '__module__', '').lower()]\n"
        "sys.path = [p for p in sys.path if not p.endswith('src')]\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        f"InteractiveShell.instance().run_cell({cell!r})\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "pip install -r requirements.txt -e ." in lines[0], lines
    assert "Traceback" not in out.stdout + out.stderr


def test_setup_cell_is_silent_when_pt215_is_installed():
    out = subprocess.run([sys.executable, "-c", setup_cell_source("")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == "" and SETUP_CELL_MARKER in setup_cell_source("")


def test_book_config_reads_the_real_config():
    cfg = read_book_config(ROOT)
    assert cfg.branch and isinstance(cfg.repository_url, str)


def test_shipped_files_are_found_through_pt215():
    assert chapter_script("hello.py").parent.name == "00-before-you-start"
    assert chapter_script("00-before-you-start/hello.py").is_file()
    assert data_path("05-nvfp4-decoding/lm-dense.pt").is_file()
    with pytest.raises(BookFilesError, match="no chapter of the book has a script named 'nope.py'"):
        chapter_script("nope.py")
    with pytest.raises(ValueError, match="relative must be a path inside data/"):
        data_path("../secrets")


def test_jupyterlab_is_installed():
    out = subprocess.run([sys.executable, "-m", "jupyterlab", "--version"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip()[:1].isdigit(), out.stderr


# The cells whose last digits depend on the CPU's matmul kernels (pt215.cpu_kernels): the main run executes
# them with this machine's own kernels; this runs them again restricted to AVX2, against the same stored digits.
CPU_SENSITIVE = ["chapters/03-nixl-transfers/03-2-kv-migration.ipynb",
                 "chapters/04-fsdp2-precision/04-1-precision-overrides.ipynb",
                 "chapters/06-fp8-mps/06-1-fp8-scaled-mm.ipynb",
                 "chapters/06-fp8-mps/06-2-moe-decode-streams.ipynb"]


@pytest.mark.slow
@pytest.mark.skipif(active_capability() == "AVX2" or os.uname().machine != "x86_64",
                    reason="this machine's own kernels are AVX2 already: the main run covers it")
def test_cpu_sensitive_notebooks_hold_with_avx2_kernels():
    env = {**os.environ, **AVX2_ONLY}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "--no-header", *CPU_SENSITIVE],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-4000:]


def _pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, rest = line.split("==", 1)
            out[name.strip().lower()] = rest.strip()
    return out


def test_binder_environment_matches_the_book_pins():
    binder, book = _pins(ROOT / ".binder/requirements.txt"), _pins(ROOT / "requirements.txt")
    assert binder and all(book.get(name) == version for name, version in binder.items()), (binder, book)
    assert (ROOT / ".binder/runtime.txt").read_text().strip() == "python-3.11"
    assert "jupyter-book" not in binder and "pytest" not in binder  # notebooks only, not the toolchain


def test_at_most_a_tenth_of_code_cells_ignore_their_output():
    """Stable outputs are the rule: `nbval-ignore-output` is for timings, and kept rare book-wide."""
    import nbformat

    code = [c for p in sorted(ROOT.glob("chapters/*/[0-9]*.ipynb"))
            for c in nbformat.read(p, as_version=4).cells if c.cell_type == "code"]
    ignored = sum("nbval-ignore-output" in c.metadata.get("tags", []) for c in code)
    assert ignored <= 0.10 * len(code), f"{ignored} of {len(code)} code cells are output-ignored (at most 10 %)"


# Scripts that never tear a healthy group down, and why.
NO_SHUTDOWN = {
    "resolve_backend.py": "one process on a HashStore per backend name: nothing to synchronise",
    "gloo_no_autodump.py": "the group is broken on purpose; it leaves with os._exit",
}


def test_every_multi_rank_script_ends_through_the_clean_shutdown():
    """`pt215.launch.shutdown()` ends every healthy group a chapter script joins."""
    for path in sorted(ROOT.glob("chapters/*/*.py")):
        text = path.read_text(encoding="utf-8")
        if "init_process_group" not in text and "init_rank(" not in text or path.name in NO_SHUTDOWN:
            continue
        assert "shutdown()" in text, f"{path.relative_to(ROOT)} does not end with shutdown()"


def test_stress_script_knows_only_real_scripts():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import stress_launch
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    for name in stress_launch.SCRIPTS:
        assert chapter_script(name).is_file()
