"""Shared test settings: the book's root folder and a per-test unique marker for launched scripts."""

from __future__ import annotations

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
