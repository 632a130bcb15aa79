"""Where the book's chapter scripts and shipped data live, in a checkout or in an installed `pt215` wheel.

A notebook downloaded from the website, or opened in Colab or Binder, runs in a folder of its own: the scripts it
launches (`pt215.launch.run("hello.py")`) and the data it loads (chapter 5's model weights, chapter 2's mystery
dumps) are found through these functions, not through paths relative to the notebook. In a checkout of the book
they are the repository's `chapters/` and `data/`; the wheel carries copies under `pt215/_book/` (pyproject.toml).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

__all__ = ["BookFilesError", "book_root", "chapter_script", "data_path"]

_PACKAGE = Path(__file__).resolve().parent


class BookFilesError(FileNotFoundError):
    """A chapter script or data file the book ships is not where it should be."""


@cache
def book_root() -> Path:
    """The folder that holds `chapters/` and `data/`: the checkout (editable install) or `pt215/_book` (wheel)."""
    for candidate in (_PACKAGE / "_book", _PACKAGE.parents[1]):
        if (candidate / "chapters").is_dir() and (candidate / "data").is_dir():
            return candidate
    raise BookFilesError(
        "pt215 cannot find the book's chapters/ and data/ folders: install pt215 from a checkout of the book "
        "(pip install -e .) or from a wheel built from one (pip wheel .)")


def data_path(relative: str) -> Path:
    """A shipped data file or folder, e.g. `data_path("05-nvfp4-decoding/lm-dense.pt")`."""
    if not isinstance(relative, str) or not relative or relative.startswith(("/", "..")):
        raise ValueError(f"data_path(): relative must be a path inside data/, like '05-nvfp4-decoding/lm-dense.pt'; "
                         f"got {relative!r}")
    path = book_root() / "data" / relative
    if not path.exists():
        raise BookFilesError(f"data_path(): the book ships no data/{relative} (looked in {book_root().name}/data)")
    return path


def chapter_script(name: str) -> Path:
    """A chapter's standalone script: `"hello.py"`, or chapter-qualified `"00-before-you-start/hello.py"`."""
    if not isinstance(name, str) or not name.endswith(".py"):
        raise ValueError(f"chapter_script(): name must be a script file name ending in .py; got {name!r}")
    chapters = book_root() / "chapters"
    if "/" in name:
        path = chapters / name
        if path.is_file():
            return path
        raise BookFilesError(f"chapter_script(): no chapters/{name} in the book")
    found = sorted(chapters.glob(f"*/{name}"))
    if len(found) == 1:
        return found[0]
    if not found:
        raise BookFilesError(f"chapter_script(): no chapter of the book has a script named {name!r}")
    raise BookFilesError(f"chapter_script(): {name!r} is ambiguous; name its chapter: "
                         + ", ".join(f"'{p.parent.name}/{name}'" for p in found))
