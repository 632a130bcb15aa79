"""pt215.timing: the shared timing loop (chapters 3, 5, 6)."""

from __future__ import annotations

import pytest

from pt215.timing import median_seconds, time_samples


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
