"""Notebooks marked `pt215: standalone: true` run in tests/test_standalone_notebooks.py (alone in an empty folder,
pt215 from its wheel) instead of here, so every notebook is executed once per test run."""

from __future__ import annotations

import json
from pathlib import Path


def pytest_ignore_collect(collection_path: Path, config) -> bool | None:  # noqa: ARG001 - pytest hook
    if collection_path.suffix != ".ipynb":
        return None
    meta = json.loads(collection_path.read_text(encoding="utf-8")).get("metadata", {}).get("pt215") or {}
    return True if meta.get("standalone") else None
