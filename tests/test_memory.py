"""Tests for pt215.memory (chapters 4 and 10): CPU tensor bytes from the allocator's events, and what autograd saves."""

import pytest
import torch

from pt215.memory import SavedTensors, peak_cpu_bytes, retained_cpu_bytes, saved_tensor_bytes


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
    assert retained_cpu_bytes(lambda: None) == (0, None)


def test_retained_counts_what_is_still_held_at_the_end():
    def make():
        tmp = torch.ones(1000, 250)  # freed before the end: not retained
        keep = torch.ones(500, 250)  # 0.5 MB returned
        del tmp
        return keep

    held, out = retained_cpu_bytes(make)
    assert held == out.numel() * 4


def test_saved_tensor_bytes_counts_each_storage_once_and_leaves_out_parameters():
    w = torch.nn.Parameter(torch.randn(16, 8))
    x = torch.randn(4, 8, requires_grad=True)

    def forward():
        h = x @ w.t()           # saves x and w
        return (h * h).sum()    # saves h (twice: both operands are h)

    saved, out = saved_tensor_bytes(forward, exclude=[w])
    assert isinstance(saved, SavedTensors) and out.requires_grad
    assert saved.nbytes == x.numel() * 4 + 4 * 16 * 4  # x and h once each; w left out
    assert saved.by_dtype() == {"float32": saved.nbytes}
    with_w, _ = saved_tensor_bytes(forward)
    assert with_w.nbytes == saved.nbytes + w.numel() * 4
    # the control: the same difference seen by the allocator
    held, _ = retained_cpu_bytes(forward)
    assert held >= 4 * 16 * 4  # h at least (x existed before)


def test_bad_arguments():
    with pytest.raises(TypeError, match="fn must be callable"):
        peak_cpu_bytes(3)
    with pytest.raises(TypeError, match="fn must be callable"):
        retained_cpu_bytes("x")
    with pytest.raises(TypeError, match="fn must be callable"):
        saved_tensor_bytes(None)
    with pytest.raises(TypeError, match="exclude must hold tensors"):
        saved_tensor_bytes(lambda: None, exclude=[3])
