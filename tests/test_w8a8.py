"""Tests for pt215.w8a8 (chapter 6): a chapter-5 model with every GEMM in FP8."""

from __future__ import annotations

import pytest
import torch

from pt215 import fp8, w8a8


def test_fp8_model_is_close_to_the_model(tiny_moe_model):
    tok = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = tiny_moe_model(tok)
        for sc in ("tensorwise", "rowwise"):
            assert fp8.rel_error(ref, w8a8.fp8_model(tiny_moe_model, scaling=sc)(tok)) < 0.15
        dense_experts = w8a8.fp8_model(tiny_moe_model, experts=False, lm_head=False)
        assert fp8.rel_error(ref, dense_experts(tok)) < 0.15
    converted = w8a8.fp8_model(tiny_moe_model)
    assert isinstance(converted.lm_head, fp8.FP8Linear)
    assert type(converted.layers[0].mlp).__name__ == "MoEVariant"
    assert type(tiny_moe_model.layers[0].mlp).__name__ == "MoE"  # the original is untouched


def test_fp8_model_errors():
    with pytest.raises(ValueError, match="DecoderLM"):
        w8a8.fp8_model(torch.nn.Linear(2, 2))
