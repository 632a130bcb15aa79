"""pt215.pipeline (chapter 8): storage-level accounting, its allocator control, reading and drawing schedules."""

from __future__ import annotations

import gc

import pytest
import torch
from torch.profiler import record_function

from pt215.pipeline import (
    LiveStorage,
    action_counts,
    action_rows,
    allocator_check,
    allocator_profile,
    bubble_fraction,
    compute_grid,
    draw_schedule,
    memory_steps,
    output_kept_by_autograd,
    pending_sends,
    slot_positions,
    track_pipeline_memory,
    transfers,
    unshard_positions,
)


def test_a_storage_is_counted_once_whatever_refers_to_it():
    live = LiveStorage()
    a = torch.zeros(16)  # 64 bytes
    b = torch.zeros(8, dtype=torch.float64)  # 64 bytes
    assert live.add(a, "recv") is True
    assert live.add(a, "recv") is False  # the same tensor
    assert live.add(a[4:8], "output") is False  # a view: same storage, still under its first kind
    assert live.add(a.detach(), "recv") is False  # another tensor object on the same storage
    assert live.add(b, "output") is True
    assert live.total == 128 and live.peak == 128 and live.allocations == {"recv": 1, "output": 1}
    del a
    gc.collect()
    assert live.live["recv"] == 0 and live.total == 64 and live.peak == 128
    assert live.peak_by_kind == {"recv": 64, "output": 64}
    live.reset_peak()
    assert live.peak == 64 and live.allocations == {} and live.peak_by_kind == {"recv": 0, "output": 64}
    assert [(life.kind, life.carried, life.added_at) for life in live.lives] == [("output", True, -1)]


def test_a_view_counts_its_whole_storage():
    live = LiveStorage()
    base = torch.zeros(64)
    view = base[:4]
    del base
    live.add(view, "output")
    assert live.total == 256  # the storage, not the view's 16 bytes


def test_bad_input_is_named():
    live = LiveStorage()
    with pytest.raises(ValueError, match="torch.Tensor"):
        live.add([1, 2], "recv")
    with pytest.raises(ValueError, match="kind"):
        live.add(torch.zeros(1), "")
    with pytest.raises(ValueError, match="LiveStorage"):
        with track_pipeline_memory([], object()):
            pass
    with pytest.raises(ValueError, match="LiveStorage"):
        allocator_check(None, object())
    with pytest.raises(ValueError, match="callable"):
        output_kept_by_autograd(3, torch.zeros(2))
    with pytest.raises(ValueError, match="floating-point"):
        output_kept_by_autograd(torch.relu, torch.zeros(2, dtype=torch.long))


def test_an_output_autograd_keeps_stays_counted_until_the_backward():
    for act, kept in ((torch.relu, True), (torch.nn.functional.gelu, False)):
        live = LiveStorage()
        x = torch.randn(4, 8, requires_grad=True)
        y = act(x * 2)
        live.add(y, "output")
        loss = y.sum()
        del y
        gc.collect()
        assert (live.total > 0) is kept
        loss.backward()
        del loss
        gc.collect()
        assert live.total == 0
        assert output_kept_by_autograd(act, x) is kept


STEPS = ["forward", "drop the output", "backward"]


def _lifetimes(act, tracker):
    lin, x = torch.nn.Linear(32, 32), torch.randn(16, 32)
    with allocator_profile() as prof:
        tracker.reset_peak()
        for i, name in enumerate(STEPS):
            tracker.position = i
            with record_function(f"PP:{name}"):
                if name == "forward":
                    y = act(lin(x))
                    tracker.add(y, "output")
                    loss = y.sum()
                elif name == "drop the output":
                    del y
                else:
                    loss.backward()
    return tracker, allocator_check(prof, tracker)


class _TensorObjectTracker(LiveStorage):
    def _watched(self, tensor, storage):
        return tensor


def test_the_allocator_control_agrees_with_storages_and_catches_tensor_objects():
    tracker, chk = _lifetimes(torch.relu, LiveStorage())
    assert chk.agrees and chk.matched == 1 and chk.frees == [2] and tracker.lives[0].freed_at == 2
    assert chk.peak == chk.tracker_peak == 16 * 32 * 4
    tracker, chk = _lifetimes(torch.relu, _TensorObjectTracker())
    assert not chk.agrees and tracker.lives[0].freed_at == 1 and chk.moved == [("output", 2048, 1, 2)]
    _, chk = _lifetimes(torch.nn.functional.gelu, _TensorObjectTracker())
    assert chk.agrees and chk.frees == [1]


def test_the_control_needs_the_whole_step_profiled():
    tracker = LiveStorage()
    tracker.position = 5  # six actions counted, none profiled
    with allocator_profile() as prof:
        torch.zeros(4)
    with pytest.raises(ValueError, match="profile the whole step"):
        allocator_check(prof, tracker)


ROWS = {1: ["1UNSHARD", "1F0", None, "1SEND_F0", "5UNSHARD", "1F1", "5F0", "5B0", "1WAIT_SEND_F0"],
        0: ["0UNSHARD", "4UNSHARD", "0F0"]}


def test_reading_lowered_actions():
    rows = action_rows(ROWS)
    assert list(rows) == [0, 1] and None not in rows[1]
    assert unshard_positions(rows) == {0: [0, 0], 1: [0, 1]}
    counts = action_counts(rows, ["SEND_F", "UNSHARD", "WAIT_SEND_F"])
    assert counts[1] == {"SEND_F": 1, "UNSHARD": 2, "WAIT_SEND_F": 1}
    assert transfers(rows)[1] == [a for a in rows[1] if a != "1WAIT_SEND_F0"]
    assert pending_sends(["1F0", "1SEND_F0", "1F1", "1SEND_F1", "1WAIT_SEND_F0", "2SEND_B0", "1WAIT_SEND_F1"]) == [
        0, 1, 1, 2, 1, 2, 1]
    with pytest.raises(ValueError, match="pipeline_order_with_comms"):
        action_rows([["0F0"]])


class _Action:
    def __init__(self, name: str):
        self.name = name

    def __str__(self) -> str:
        return self.name


def test_the_compute_grid_its_bubble_and_memory_on_its_time_axis():
    grid = compute_grid({1: [None, _Action("1F0"), _Action("1B0")], 0: [_Action("0F0"), None, None, _Action("0B0")]})
    assert grid == {0: ["0F0", "", "", "0B0"], 1: ["", "1F0", "1B0"]}
    assert bubble_fraction(grid) == pytest.approx(4 / 8)  # 2 idle slots a rank, up to the last busy one
    positions = slot_positions(grid[1], ["1RECV_F0", "1F0", "1SEND_F0", "1RECV_B0", "1B0"])
    assert positions == [-0.5, 1.0, 1.5, 1.5, 2.0]
    assert memory_steps([(-1, 0), (0, 64), (4, 0)], positions) == ([-1.0, -0.5, 2.0], [0, 64, 0])
    with pytest.raises(ValueError, match="at least one rank"):
        bubble_fraction({})
    with pytest.raises(ValueError, match="pipeline_order"):
        compute_grid([[None]])


def test_draw_schedule_draws_the_grid_and_names_bad_input():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = draw_schedule({0: ["0F0", "", "0B0"], 1: ["", "1F0", "1B0"]}, title="t")
    assert ax.get_title() == "t" and ax.get_legend() is not None
    plt.close(fig)
    with pytest.raises(ValueError, match="not compute actions"):
        draw_schedule({0: ["0SEND_F0"]})
    with pytest.raises(ValueError, match="compute_grid"):
        draw_schedule({})
