"""pt215.site.config: launch buttons that point somewhere or nowhere, and the setup cell every notebook starts
with (see "Install and run")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pt215.site.config import (
    SETUP_CELL_MARKER,
    BookConfig,
    configure_launch_buttons,
    read_book_config,
    setup_cell_source,
)

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
