"""Shared test settings: the book's root folder and a per-test unique marker for launched scripts."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def book_root() -> Path:
    return ROOT


@pytest.fixture
def unique_name() -> str:
    """A script name no other test or notebook uses, so process counts by name are exact."""
    return f"pt215_test_{uuid.uuid4().hex[:10]}"
