"""pt215.pipeline (chapter 8): live-byte accounting and reading lowered pipeline schedules."""

from __future__ import annotations

import gc

import pytest
import torch

from pt215.pipeline import LiveBytes, action_counts, action_rows, unshard_positions


def test_live_bytes_counts_until_freed_and_keeps_the_peak():
    live = LiveBytes()
    a = torch.zeros(16)  # 64 bytes
    b = torch.zeros(8, dtype=torch.float64)  # 64 bytes
    live.add(a, "recv")
    live.add(a, "recv")  # counted once
    live.add(b, "output")
    assert live.total == 128 and live.peak == 128 and live.allocations == {"recv": 1, "output": 1}
    del a
    gc.collect()
    assert live.live["recv"] == 0 and live.total == 64 and live.peak == 128
    assert live.peak_by_kind == {"recv": 64, "output": 64}
    live.reset_peak()
    assert live.peak == 64 and live.allocations == {} and live.peak_by_kind == {"recv": 0, "output": 64}
    with pytest.raises(ValueError, match="torch.Tensor"):
        live.add([1, 2], "recv")
    with pytest.raises(ValueError, match="kind"):
        live.add(b, "")


def test_reading_lowered_actions():
    rows = action_rows({1: ["1UNSHARD", "1F0", None, "1SEND_F0", "5UNSHARD", "1F1", "5F0", "5B0", "1WAIT_SEND_F0"],
                        0: ["0UNSHARD", "4UNSHARD", "0F0"]})
    assert list(rows) == [0, 1] and None not in rows[1]
    assert unshard_positions(rows) == {0: [0, 0], 1: [0, 1]}
    counts = action_counts(rows, ["SEND_F", "UNSHARD", "WAIT_SEND_F"])
    assert counts[1] == {"SEND_F": 1, "UNSHARD": 2, "WAIT_SEND_F": 1}
    with pytest.raises(ValueError, match="pipeline_order_with_comms"):
        action_rows([["0F0"]])
