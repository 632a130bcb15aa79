"""Build the whole book as one download: every notebook, the chapter scripts, `data/`, the requirements files,
the `pt215` wheel and a short README, in one zip linked from every page's header.

    .venv/bin/python scripts/build_download.py                 # writes _build/html/_downloads/<ZIP_NAME>
    .venv/bin/python scripts/build_download.py --out DIR

The website build runs it (`pt215.site`, when the HTML build finishes), so README command 1 makes it. Each
notebook's first cell is the setup cell of the current `_config.yml` (`pt215.site.config.setup_cell_source`): when
`pt215` is missing it installs the wheel that lies at the top of the unpacked folder. The zip is reproducible (fixed
timestamps) and cached under `_build/download-cache/` by the digest of its inputs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ZIP_NAME = "pytorch-2.15-in-practice.zip"
TOP = "pytorch-2.15-in-practice"
STAMP = (2026, 1, 1, 0, 0, 0)  # every member's date: same inputs, same bytes
CHAPTER_FILES = ("[0-9]*.ipynb", "*.py", "*.txt")
WHEEL_INPUTS = ("pyproject.toml", "src/pt215/*.py", "src/pt215/*/*.py")

README = """# PyTorch 2.15 in Practice: the notebooks

| path | what |
|---|---|
| `chapters/NN-*/` | each chapter's notebooks (`.ipynb`, with the website's outputs) and the scripts they launch |
| `data/` | shipped data: model weights, mystery dumps, results recorded on real GPUs |
| `requirements-participant.txt` | exactly what the notebooks need (torch 2.15.0, JupyterLab ...), pinned |
| `requirements.txt` | the same pins plus the tools that build the book's website and test it |
| `{wheel}` | the book's helper package `pt215` (it carries the chapter scripts and data too) |

## Run the notebooks

```bash
python3 -m venv .venv
.venv/bin/pip install -r requirements-participant.txt {wheel}
.venv/bin/jupyter lab chapters/
```

Python 3.11 or 3.12. Every notebook's first cell installs `pt215` from the wheel in this folder when it is
missing, so a notebook opened from here in any Jupyter (or on Colab, with the wheel uploaded beside it) runs on
its own. Then run `python -m pt215.doctor` to see which chapters your machine can run for real: a cell that
needs hardware you lack prints one line saying what it needs.
"""


def _members(root: Path) -> list[tuple[Path, str]]:
    """(file, name inside the zip) for the book's notebooks, chapter scripts, data and requirements."""
    found: list[tuple[Path, str]] = []
    for pattern in CHAPTER_FILES:
        found += [(p, p.relative_to(root).as_posix()) for p in root.glob(f"chapters/*/{pattern}")]
    found += [(p, p.relative_to(root).as_posix()) for p in (root / "data").rglob("*")
              if p.is_file() and "__pycache__" not in p.parts]
    for name in ("requirements.txt", "requirements-participant.txt"):
        if (root / name).is_file():
            found.append((root / name, name))
    return sorted(set(found), key=lambda m: m[1])


def _wheel_inputs(root: Path) -> list[Path]:
    return sorted({p for pattern in WHEEL_INPUTS for p in root.glob(pattern)})


def digest(root: Path, install_source: str) -> str:
    """sha256 of everything the zip is made of (its files, the wheel's sources, the setup cell's source)."""
    h = hashlib.sha256(install_source.encode())
    for path in [m[0] for m in _members(root)] + _wheel_inputs(root):
        if path.is_file():
            h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def build_wheel(root: Path, dest: Path) -> Path:
    """The pt215 wheel (no dependencies bundled, no network: setuptools from the running environment)."""
    dest.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                           "--disable-pip-version-check", "-w", str(dest), str(root)],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode:
        raise RuntimeError(f"build_download: pip wheel failed:\n{proc.stderr[-3000:]}")
    wheels = sorted(dest.glob("pt215-*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"build_download: expected one pt215 wheel in {dest.name}, got {len(wheels)}")
    return wheels[0]


def with_setup_cell(notebook: bytes, setup_source: str, marker: str) -> bytes:
    """The notebook with its setup cell (the first code cell carrying `marker`) set to `setup_source`."""
    nb = json.loads(notebook)
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code":
            src = "".join(cell.get("source", []))
            if marker in src:
                cell["source"] = setup_source
                cell["outputs"] = []
            break
    return (json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n").encode("utf-8")


def _add(zf: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(f"{TOP}/{name}", date_time=STAMP)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    zf.writestr(info, data)


def read_install_source(root: Path) -> str:
    """What the setup cell installs pt215 from when no wheel lies beside the notebook (from `_config.yml`)."""
    from pt215.site.config import read_book_config

    return read_book_config(Path(root)).install_source


def build(root: Path = ROOT, out_dir: Path | None = None) -> Path:
    """Write `out_dir/ZIP_NAME` (default `_build/html/_downloads/`) and return its path."""
    from pt215.site.config import SETUP_CELL_MARKER, setup_cell_source

    root = Path(root)
    out_dir = Path(out_dir) if out_dir else root / "_build" / "html" / "_downloads"
    install_source = read_install_source(root)
    cache = root / "_build" / "download-cache" / f"{digest(root, install_source)}.zip"
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / ZIP_NAME
    if not cache.is_file():
        setup_source = setup_cell_source(install_source)
        with tempfile.TemporaryDirectory() as tmp:
            wheel = build_wheel(root, Path(tmp))
            part = cache.with_suffix(".part")
            part.parent.mkdir(parents=True, exist_ok=True)
            with zipfile.ZipFile(part, "w") as zf:
                _add(zf, "README.md", README.format(wheel=wheel.name).encode())
                _add(zf, wheel.name, wheel.read_bytes())
                for path, name in _members(root):
                    data = path.read_bytes()
                    if name.endswith(".ipynb"):
                        data = with_setup_cell(data, setup_source, SETUP_CELL_MARKER)
                    _add(zf, name, data)
            for old in cache.parent.glob("*.zip"):
                old.unlink()
            part.replace(cache)
    shutil.copyfile(cache, target)
    return target


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=None, help="folder for the zip (default _build/html/_downloads)")
    a = p.parse_args(argv)
    path = build(ROOT, a.out)
    print(f"build_download: {path.name}, {path.stat().st_size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
