"""pt215.timing: the book's one clock (chapters 1, 3, 5, 6)."""

from __future__ import annotations

import pytest

from pt215 import timing
from pt215.timing import Stopwatch, interleaved_medians, interleaved_samples, median_seconds, sync, time_samples


@pytest.fixture
def syncs(monkeypatch):
    seen: list[object] = []
    monkeypatch.setattr(timing, "sync", lambda device=None: seen.append(device))
    return seen


def test_warmup_iters_and_sync_are_respected(syncs):
    calls = []
    samples = time_samples(lambda: calls.append(1), iters=3, warmup=2, device="cuda")
    assert len(samples) == 3 and all(t >= 0 for t in samples)
    assert len(calls) == 5
    assert syncs == ["cuda"] * (1 + 2 * 3)  # once after warm-up, then before and after each sample
    assert median_seconds(lambda: None, iters=1, warmup=0) >= 0


@pytest.mark.parametrize(("kw", "match"), [({"iters": 0}, "iters"), ({"iters": True}, "iters"),
                                          ({"warmup": -1}, "warmup")])
def test_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        time_samples(lambda: None, **kw)


def test_interleaved_rounds_call_every_variant_in_turn(syncs):
    order = []
    samples = interleaved_samples({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, iters=3,
                                  warmup=1, device="mps")
    assert order == ["a", "b"] * 4 and syncs == ["mps"] * (2 * 2 * 3)
    assert {k: len(v) for k, v in samples.items()} == {"a": 3, "b": 3}
    assert set(interleaved_medians({"x": lambda: None}, iters=1, warmup=0)) == {"x"}


@pytest.mark.parametrize("fns", [{}, {"a": 1}, [lambda: None]])
def test_interleaved_rejects_bad_variants(fns):
    with pytest.raises(ValueError, match="fns"):
        interleaved_samples(fns)


def test_stopwatch_freezes_at_block_end_and_runs_otherwise(syncs):
    with Stopwatch("cuda:1") as sw:
        pass
    frozen = sw.seconds
    assert frozen >= 0 and sw.seconds == frozen
    running = Stopwatch()
    assert 0 <= running.seconds <= running.seconds
    assert syncs.count("cuda:1") == 3  # construction, entry, exit; reading a frozen watch does not sync


def test_sync_on_cpu_returns_and_bad_device_is_named():
    sync(None)
    sync("cpu")
    with pytest.raises(ValueError, match="device"):
        sync("not-a-device")


def test_calls_puts_many_calls_between_two_syncs(monkeypatch):
    from pt215 import timing

    syncs: list[object] = []
    monkeypatch.setattr(timing, "sync", lambda device=None: syncs.append(device))
    count = {"n": 0}

    def op():
        count["n"] += 1

    samples = timing.time_samples(op, iters=3, warmup=1, device="cpu", calls=50)
    assert len(samples) == 3 and count["n"] == 1 + 3 * 50
    assert len(syncs) == 1 + 3 * 2  # once before warm-up, then two per sample: not one per call
    med = timing.interleaved_medians({"a": op, "b": op}, iters=2, warmup=0, calls=10)
    assert set(med) == {"a", "b"} and count["n"] == 151 + 2 * 2 * 10


def test_calls_must_be_a_positive_int():
    import pytest

    from pt215.timing import median_seconds

    with pytest.raises(ValueError, match="calls must be a positive int"):
        median_seconds(lambda: None, calls=0)


def test_thread_cpu_samples_counts_work_not_waiting():
    import time

    from pt215.timing import thread_cpu_samples

    waited = thread_cpu_samples(lambda: time.sleep(0.01), iters=2, calls=2)
    assert len(waited) == 2 and all(s < 0.005 for s in waited)  # sleeping costs this thread no CPU
