"""Shared test settings: the book's root folder and a per-test unique marker for launched scripts."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def book_root() -> Path:
    return ROOT


@pytest.fixture
def unique_name() -> str:
    """A script name no other test or notebook uses, so process counts by name are exact."""
    return f"pt215_test_{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def tiny_moe_model():
    """A seeded 2-layer MoE language model (4 experts, top-2) in eval mode: chapters 5 and 6's model, small."""
    from pt215 import model as lm

    torch.manual_seed(0)
    cfg = lm.ModelConfig(d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, ffn_hidden=64, max_seq_len=64,
                         moe_experts=4, moe_top_k=2, moe_ffn_hidden=32)
    return lm.build_model(cfg).eval()


# ---------------------------------------------------------------- longest files first

DURATIONS = ROOT / "tests" / "durations.json"
"""Seconds per test file (a notebook is one file) from the last measured run (`scripts/suite_times.py --write`)."""
UNKNOWN_SECONDS = 5.0  # a file the table does not know yet (a new test file or notebook)


def pytest_collection_modifyitems(session, config, items) -> None:  # noqa: ARG001 - pytest hook
    """Order the files longest first (by tests/durations.json), keeping each file's own order.

    With `-n 2 --dist loadfile --no-loadscope-reorder` xdist hands out whole files in this order, so the two
    workers start on the longest files and end on short ones: neither idles while the other finishes a long one.
    """
    try:
        seconds = json.loads(DURATIONS.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    rank = {}
    for i, item in enumerate(items):
        rank.setdefault(item.nodeid.split("::", 1)[0], i)
    items.sort(key=lambda it: (-float(seconds.get(it.nodeid.split("::", 1)[0], UNKNOWN_SECONDS)),
                               rank[it.nodeid.split("::", 1)[0]]))
