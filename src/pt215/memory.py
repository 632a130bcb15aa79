"""Peak memory of a CPU computation, from the allocator's own events (chapter 4, notebook 3).

CPU tensors have no `torch.cuda.max_memory_allocated`. The profiler with ``profile_memory=True`` records every
allocation and free of the c10 CPU allocator together with the running total it reports; the peak of that
total, minus what was allocated before the first event, is the most the computation held at once. It counts
tensor storage only (not Python objects or library scratch outside c10), and depends only on the sizes the
computation allocates and frees, not on the machine's speed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["peak_cpu_bytes"]


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 (the profiler's C++ start/stop log lines) for the duration."""
    try:
        fd = os.dup(2)
    except OSError:  # no usable stderr: nothing to silence
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(fd, 2)
        os.close(fd)


def peak_cpu_bytes(fn: Callable[[], Any]) -> int:
    """Run ``fn()`` once and return the peak of CPU tensor bytes it held at once beyond what existed before.

    Allocations made inside ``fn`` and still alive at the end (results, ``.grad``) count; tensors that existed
    before the call do not.
    """
    if not callable(fn):
        raise TypeError(f"peak_cpu_bytes: fn must be callable, got {type(fn).__name__}")
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    events = []
    while stack:
        ev = stack.pop()
        stack.extend(ev.children)
        if ev.tag == _EventType.Allocation and ev.extra_fields.device.type == "cpu":
            events.append((ev.start_time_ns, ev.extra_fields.alloc_size, ev.extra_fields.total_allocated))
    if not events:
        return 0
    events.sort()
    before = events[0][2] - events[0][1]
    return max(total for _, _, total in events) - before
