"""pt215.timing: the shared timing loop (chapters 3, 5, 6)."""

from __future__ import annotations

import pytest

from pt215.timing import interleaved_medians, interleaved_samples, median_seconds, time_samples


def test_warmup_iters_and_sync_are_respected():
    calls, syncs = [], []
    samples = time_samples(lambda: calls.append(1), iters=3, warmup=2, sync=lambda: syncs.append(1))
    assert len(samples) == 3 and all(t >= 0 for t in samples)
    assert len(calls) == 5 and len(syncs) == 6
    assert median_seconds(lambda: None, iters=1, warmup=0) >= 0


@pytest.mark.parametrize(("kw", "match"), [({"iters": 0}, "iters"), ({"iters": True}, "iters"),
                                          ({"warmup": -1}, "warmup")])
def test_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        time_samples(lambda: None, **kw)


def test_interleaved_rounds_call_every_variant_in_turn():
    order, syncs = [], []
    samples = interleaved_samples({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, iters=3,
                                  warmup=1, sync=lambda: syncs.append(1))
    assert order == ["a", "b"] * 4 and len(syncs) == 2 * 2 * 3
    assert {k: len(v) for k, v in samples.items()} == {"a": 3, "b": 3}
    assert set(interleaved_medians({"x": lambda: None}, iters=1, warmup=0)) == {"x"}


@pytest.mark.parametrize("fns", [{}, {"a": 1}, [lambda: None]])
def test_interleaved_rejects_bad_variants(fns):
    with pytest.raises(ValueError, match="fns"):
        interleaved_samples(fns)
