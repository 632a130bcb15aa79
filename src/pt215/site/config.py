"""The book's own settings in `_config.yml`: its public home, the optional team JupyterHub, and how a notebook
opened on its own (a download, Colab, Binder, a hub) installs `pt215`.

One place: `repository.url` (and `branch`), `repository.install` (a pip requirement; by default derived from the
URL) and `launch_buttons.jupyterhub_url`. With no URL there is no repository, Binder or Colab button; with no hub
there is no hub button (`configure_launch_buttons`, run by `pt215.site` when the site is built). Every notebook's
first code cell is `setup_cell_source(...)` of these settings; `scripts/sync_setup_cell.py` writes it and a test
checks it. Used by the website and every notebook (see "Install and run").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["BookConfig", "configure_launch_buttons", "read_book_config", "setup_cell_source", "SETUP_CELL_MARKER"]

SETUP_CELL_MARKER = "# Setup: the book's helper package"


@dataclass(frozen=True)
class BookConfig:
    repository_url: str = ""
    branch: str = "main"
    install: str = ""
    jupyterhub_url: str = ""

    @property
    def install_source(self) -> str:
        """The pip requirement that installs pt215 in a notebook opened on its own ('' when the book names none)."""
        if self.install:
            return self.install
        if self.repository_url:
            return f"pt215 @ git+{self.repository_url.rstrip('/')}.git@{self.branch}"
        return ""


def read_book_config(root: Path) -> BookConfig:
    """The settings above, read from `root/_config.yml`."""
    import yaml

    path = Path(root) / "_config.yml"
    data: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    repo = data.get("repository") or {}
    launch = data.get("launch_buttons") or {}
    return BookConfig(
        repository_url=str(repo.get("url") or "").strip(),
        branch=str(repo.get("branch") or "main").strip(),
        install=str(repo.get("install") or "").strip(),
        jupyterhub_url=str(launch.get("jupyterhub_url") or "").strip(),
    )


def configure_launch_buttons(theme_options: dict[str, Any], cfg: BookConfig) -> dict[str, Any]:
    """Theme options with every button that would point nowhere removed (no URL: no repository, Binder, Colab or
    hub button; no hub: no hub button)."""
    opts = dict(theme_options)
    launch = dict(opts.get("launch_buttons") or {})
    if not cfg.repository_url:
        opts["use_repository_button"] = False
        opts["use_issues_button"] = False
        opts["use_edit_page_button"] = False
        opts["repository_url"] = ""
        launch = {k: v for k, v in launch.items() if not k.endswith("_url") and k != "thebe"}
    else:
        opts["use_repository_button"] = True
        if not cfg.jupyterhub_url:
            launch.pop("jupyterhub_url", None)
    opts["launch_buttons"] = launch
    return opts


def setup_cell_source(install_source: str) -> str:
    """The first code cell of every notebook: install pt215 when missing, from the wheel that comes with the book's
    download (beside the notebook or up to two folders above it), else from `install_source`; one line of advice
    if neither works."""
    return f'''{SETUP_CELL_MARKER} `pt215`. In a checkout of the book it is already installed and this
# cell does nothing; in a notebook opened on its own it installs it first: from the wheel that comes with the
# book's download (next to this notebook or up to two folders above it), else from the book's repository.
import glob
import importlib
import importlib.util
import subprocess
import sys

PT215_SOURCE = {install_source!r}  # set from _config.yml (repository.install)
if importlib.util.find_spec("pt215") is None:
    _wheels = sorted(glob.glob("pt215-*.whl") + glob.glob("../pt215-*.whl") + glob.glob("../../pt215-*.whl"))
    _source = _wheels[-1] if _wheels else PT215_SOURCE
    if _source:
        _pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                               _source], capture_output=True, text=True)
        if _pip.returncode:
            print(_pip.stderr[-2000:])
        importlib.invalidate_caches()
if importlib.util.find_spec("pt215") is None:
    class MissingPt215(Exception):
        def _render_traceback_(self):  # IPython: show this one line, not a traceback
            return [str(self)]

    raise MissingPt215("This notebook needs the book's helper package pt215: open it from the book's download "
                       "(the zip linked at the top of every page of the website, with the pt215 wheel in it), or in "
                       "a checkout run `pip install -r requirements.txt -e .` (see Install and run), then restart "
                       "the kernel.")'''
