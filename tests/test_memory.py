"""Tests for pt215.memory (chapter 4, notebook 3): peak CPU tensor bytes from the allocator's events."""

import pytest
import torch

from pt215.memory import peak_cpu_bytes


def test_peak_counts_what_is_alive_at_once():
    def two_then_one():
        a = torch.ones(1000, 250)  # 1 MB
        b = torch.ones(1000, 250)  # 1 MB more: the peak
        del a, b
        return torch.ones(1000, 250)

    peak = peak_cpu_bytes(two_then_one)
    assert 2_000_000 <= peak < 2_100_000


def test_tensors_from_before_do_not_count_and_nothing_is_zero():
    big = torch.ones(1_000_000)
    assert peak_cpu_bytes(lambda: big.view(-1)) < 1000
    assert peak_cpu_bytes(lambda: None) == 0


def test_bad_argument():
    with pytest.raises(TypeError, match="fn must be callable"):
        peak_cpu_bytes(3)
