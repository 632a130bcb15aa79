"""Pipeline parallelism in 2.15: storage-level memory accounting, its allocator control, reading a lowered schedule
and drawing it (chapter 8).

`LiveStorage` counts the bytes of *storages* still alive. It keys on a tensor's `untyped_storage()` and subtracts the
bytes when that storage is freed, not when the Python tensor object dies: autograd keeps a saved tensor as a new
tensor object on the same storage (ReLU's backward keeps its output that way), so a tracker keyed on the tensor
object would see bytes freed that are still held. `track_pipeline_memory` installs it on the three kinds of
per-microbatch tensors a stage makes (the receive buffer 2.15's `_RecvInfo.allocate_buffer` makes just before each
receive, each stage's forward output, and the input gradient its backward sends back) and records which schedule
action was running at every allocation and free. `allocator_check` is the control: it rebuilds the same lifetimes
from the CPU allocator's own events, as `torch.profiler` (``profile_memory=True``, `allocator_profile`) recorded
them, and the two must agree.

`action_rows`, `unshard_positions`, `action_counts`, `transfers` and `pending_sends` read a schedule's lowered
action lists (`pipeline_order_with_comms`), which every rank holds for every rank; `draw_schedule` draws the compute
grid (`pipeline_order`, `compute_grid`) as time slots x ranks with the bubble left empty, and `slot_positions` and
`memory_steps` put a tracker's events on the same time axis. `output_kept_by_autograd` says whether an op's backward
keeps its output.
"""

from __future__ import annotations

import contextlib
import re
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LiveStorage", "StorageLife", "track_pipeline_memory", "allocator_profile", "allocator_check",
           "AllocatorCheck", "output_kept_by_autograd", "action_rows", "pending_sends", "unshard_positions",
           "action_counts", "transfers", "slot_positions", "memory_steps", "compute_grid", "bubble_fraction",
           "draw_schedule"]


@dataclass
class StorageLife:
    """One counted storage: its bytes, kind, address, and the schedule actions in which it was added and freed.

    `added_at` and `freed_at` index the rank's lowered action list (-1: before the first action of the step);
    `freed_at` is None while the storage is alive; `carried` marks a storage added in an earlier step.
    """

    kind: str
    nbytes: int
    data_ptr: int
    added_at: int
    freed_at: int | None = None
    carried: bool = False


class LiveStorage:
    """Bytes of tracked storages still alive, per kind ("recv", "output", "grad"); the peak of their sum and of each.

    A storage is counted once, under the kind it was first added with, however many tensors or views of it are
    added; it is uncounted when the storage itself is freed. `position` is the schedule action now running (set by
    `track_pipeline_memory`); `events` lists `(position, total_bytes_after)` at each change, `lives` every
    storage counted since the last `reset_peak`.
    """

    def __init__(self) -> None:
        self.live: dict[str, int] = {}
        self.peak = 0
        self.peak_by_kind: dict[str, int] = {}
        self.allocations: dict[str, int] = {}
        self.position = -1
        self.events: list[tuple[int, int]] = []
        self.lives: list[StorageLife] = []
        self._counted: dict[int, StorageLife] = {}

    @property
    def total(self) -> int:
        """Bytes alive now, all kinds together."""
        return sum(self.live.values())

    def add(self, tensor: Any, kind: str) -> bool:
        """Count the bytes of `tensor`'s storage under `kind` until the storage is freed.

        Returns True when the storage is newly counted, False when it already is (a second add of the same tensor,
        of a view of it, or of another tensor on the same storage). A view counts its whole storage.
        """
        import torch

        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"add(): tensor must be a torch.Tensor, got {type(tensor).__name__}")
        if not isinstance(kind, str) or not kind:
            raise ValueError(f"add(): kind must be a non-empty name such as 'recv', got {kind!r}")
        storage = tensor.untyped_storage()  # one Python object per storage while the storage lives
        key = id(storage)
        if key in self._counted:
            return False
        nbytes = storage.nbytes()
        life = StorageLife(kind, nbytes, storage.data_ptr(), self.position)
        self._counted[key] = life
        self.lives.append(life)
        self.live[kind] = self.live.get(kind, 0) + nbytes
        self.allocations[kind] = self.allocations.get(kind, 0) + 1
        self.peak = max(self.peak, self.total)
        self.peak_by_kind[kind] = max(self.peak_by_kind.get(kind, 0), self.live[kind])
        self.events.append((self.position, self.total))
        weakref.finalize(self._watched(tensor, storage), self._free, key)
        return True

    def _watched(self, tensor: Any, storage: Any) -> Any:
        """The object whose death uncounts the bytes: the storage (a subclass may watch the tensor object, wrongly)."""
        return storage

    def _free(self, key: int) -> None:
        life = self._counted.pop(key)
        life.freed_at = self.position
        self.live[life.kind] -= life.nbytes
        self.events.append((self.position, self.total))

    def reset_peak(self) -> None:
        """Start a new step: the peak from what is alive now, and empty `allocations`, `events` and `lives`."""
        self.peak = self.total
        self.peak_by_kind = dict(self.live)
        self.allocations = {}
        self.position = -1
        self.events = [(-1, self.total)]
        self.lives = list(self._counted.values())
        for life in self.lives:  # alive before this step began
            life.added_at, life.carried = -1, True


@contextlib.contextmanager
def track_pipeline_memory(stages: Sequence[Any], tracker: LiveStorage) -> Iterator[LiveStorage]:
    """Count in `tracker` the three kinds of per-microbatch tensors a pipeline stage makes: receive buffers ("recv",
    at allocation: 2.15's `_RecvInfo.allocate_buffer`), stage outputs ("output", by a forward hook) and the input
    gradients a stage computes to send back ("grad", by a hook on each input that requires grad, which autograd
    calls as soon as it has made the gradient).

    While active, `tracker.position` follows the schedule: the runtime schedules name each action for the profiler
    (`schedules._get_profiler_function_name`) just before running it, and the wrapper counts those calls. Call
    `tracker.reset_peak()` before each `step()`.
    """
    from torch.distributed.pipelining import _recv_buffers, schedules

    if not isinstance(tracker, LiveStorage):
        raise ValueError(f"track_pipeline_memory(): tracker must be a LiveStorage, got {type(tracker).__name__}")
    original_alloc = _recv_buffers._RecvInfo.allocate_buffer
    original_name = schedules._get_profiler_function_name

    def allocate_buffer(self, device):
        buffer = original_alloc(self, device)
        tracker.add(buffer, "recv")
        return buffer

    def action_name(action):
        tracker.position += 1
        return original_name(action)

    def count_output(_module, _args, output):
        for t in output if isinstance(output, tuple | list) else (output,):
            tracker.add(t, "output")

    def count_grad(grad):
        tracker.add(grad, "grad")

    def watch_inputs(_module, args):
        for t in args:
            if getattr(t, "requires_grad", False):  # a received activation: its gradient is sent back
                t.register_hook(count_grad)

    handles = [stage.submod.register_forward_hook(count_output) for stage in stages]
    handles += [stage.submod.register_forward_pre_hook(watch_inputs) for stage in stages]
    _recv_buffers._RecvInfo.allocate_buffer = allocate_buffer
    schedules._get_profiler_function_name = action_name
    try:
        yield tracker
    finally:
        _recv_buffers._RecvInfo.allocate_buffer = original_alloc
        schedules._get_profiler_function_name = original_name
        for handle in handles:
            handle.remove()


@dataclass
class AllocatorCheck:
    """The allocator's view of the tracked storages of one step, next to the tracker's.

    `peak` is the largest sum of tracked bytes alive at once by the allocator's events, `tracker_peak` the
    tracker's; `moved` lists `(kind, nbytes, tracker's free action, allocator's free action)` for each storage the
    two place in different actions; `unmatched` counts tracked storages the allocator shows no allocation for.
    `frees` is the allocator's free action for each of `tracker.lives`, in order (None: not freed in the profile, or
    not found). `step_peak` is the allocator's whole peak during the step (every tensor: parameters' gradients, saved
    activations, temporaries) above what was allocated when the step began.
    """

    peak: int
    tracker_peak: int
    matched: int
    unmatched: int
    moved: list[tuple[str, int, int | None, int | None]] = field(default_factory=list)
    step_peak: int = 0
    frees: list[int | None] = field(default_factory=list)

    @property
    def agrees(self) -> bool:
        """Every storage matched, freed in the same action, and the same peak to the byte."""
        return self.unmatched == 0 and not self.moved and self.peak == self.tracker_peak


@contextlib.contextmanager
def allocator_profile() -> Iterator[Any]:
    """`torch.profiler.profile` over the CPU allocator's events (``profile_memory=True``), for `allocator_check`;
    the profiler's C++ start and stop log lines on file descriptor 2 are silenced while it runs."""
    from torch.profiler import ProfilerActivity, profile

    from pt215.memory import quiet_stderr

    with quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        yield prof


def _profiler_events(prof) -> tuple[list[tuple[int, int]], list[tuple[int, int, int, int]]]:
    """(PP action scopes as (start_ns, end_ns) in time order, allocator events as (t_ns, data_ptr, delta_bytes,
    bytes allocated in all after it))."""
    from torch._C._profiler import _EventType

    scopes: list[tuple[int, int]] = []
    allocs: list[tuple[int, int, int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        e = stack.pop()
        if e.tag == _EventType.Allocation:
            f = e.extra_fields
            allocs.append((e.start_time_ns, f.ptr, f.alloc_size, f.total_allocated))
        elif e.name.startswith("PP:") and e.tag in (_EventType.PyCall, _EventType.TorchOp):
            scopes.append((e.start_time_ns, e.end_time_ns))
        stack.extend(e.children)
    return sorted(scopes), sorted(allocs)


def allocator_check(prof, tracker: LiveStorage) -> AllocatorCheck:
    """Rebuild the lifetimes of `tracker.lives` from the allocator events `prof` recorded, and compare.

    `prof` is a finished `torch.profiler.profile(activities=[CPU], profile_memory=True)` that covered the step the
    tracker counted since its last `reset_peak()` (and, for a storage carried over from the step before, that
    step too: the CPU allocator reports a free to the profiler only for a block it saw allocated). The step's
    actions are the profiler's last "PP:<action>" scopes (the runtime schedules open one per action), as many as
    the tracker counted. For each counted storage, its allocation is the last one at its address and of its size
    inside the action that added it, its free the first free at that address after it; each is placed in the
    action that had started last (-1: before the first). The result compares the frees action by action and the
    peaks.
    """
    import bisect

    if not isinstance(tracker, LiveStorage):
        raise ValueError(f"allocator_check(): tracker must be a LiveStorage, got {type(tracker).__name__}")
    scopes, allocs = _profiler_events(prof)
    n = tracker.position + 1
    if n > len(scopes):
        raise ValueError(f"allocator_check(): the tracker counted {n} schedule actions but the profile holds "
                         f"{len(scopes)} 'PP:' scopes; profile the whole step")
    step = scopes[len(scopes) - n:]
    begin = scopes[len(scopes) - n - 1][1] if len(scopes) > n else None  # the previous step's last action ended
    starts = [lo for lo, _ in step]
    by_ptr: dict[int, list[tuple[int, int]]] = {}
    for t, ptr, delta, _ in allocs:
        by_ptr.setdefault(ptr, []).append((t, delta))
    in_step = [(t, delta, total) for t, _, delta, total in allocs if begin is None or t > begin]
    step_peak = (max(total for _, _, total in in_step) - (in_step[0][2] - in_step[0][1])) if in_step else 0

    def window(action: int) -> tuple[float, float]:
        if action >= 0:
            return step[action]
        return (float("-inf") if begin is None else begin, starts[0] if starts else float("inf"))

    timeline: list[tuple[float, int]] = []
    moved: list[tuple[str, int, int | None, int | None]] = []
    matched = unmatched = live = 0
    frees: list[int | None] = []
    for life in tracker.lives:
        events = by_ptr.get(life.data_ptr, [])
        if life.carried:
            made = [i for i, (t, d) in enumerate(events) if d == life.nbytes and begin is not None and t < begin]
        else:
            lo, hi = window(life.added_at)
            made = [i for i, (t, d) in enumerate(events) if lo <= t <= hi and d == life.nbytes]
        if not made:
            unmatched += 1
            frees.append(None)
            continue
        matched += 1
        if life.carried:
            live += life.nbytes
        else:
            timeline.append((events[made[-1]][0], life.nbytes))
        t_free = next((t for t, d in events[made[-1] + 1:] if d == -life.nbytes), None)
        freed = None if t_free is None else bisect.bisect_right(starts, t_free) - 1
        frees.append(freed)
        if t_free is not None:
            timeline.append((t_free, -life.nbytes))
        if freed != life.freed_at:
            moved.append((life.kind, life.nbytes, life.freed_at, freed))
    peak = live
    for _, delta in sorted(timeline):
        live += delta
        peak = max(peak, live)
    return AllocatorCheck(peak, tracker.peak, matched, unmatched, moved, step_peak, frees)


def output_kept_by_autograd(fn: Callable[[Any], Any], x: Any) -> bool:
    """Whether the backward of `y = fn(x)` saves `y` itself (ReLU, sigmoid, tanh: yes; GELU, SiLU, add: no).

    Runs `fn` once with autograd's saved-tensor hooks and asks whether any saved tensor shares `y`'s storage.
    """
    import torch

    if not callable(fn):
        raise ValueError(f"output_kept_by_autograd(): fn must be callable, got {type(fn).__name__}")
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise ValueError("output_kept_by_autograd(): x must be a floating-point torch.Tensor")
    saved: list[int] = []

    def pack(t):
        saved.append(t.untyped_storage().data_ptr())
        return t

    x = x.detach().requires_grad_(True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = fn(x)
    return y.untyped_storage().data_ptr() in saved


def action_rows(order: Mapping[int, Sequence[Any]]) -> dict[int, list[str]]:
    """Each rank's lowered actions as short strings ("0F3" = stage 0 forward of microbatch 3, "1UNSHARD")."""
    if not isinstance(order, Mapping):
        raise ValueError(f"action_rows(): order must map rank -> actions (pipeline_order_with_comms), got "
                         f"{type(order).__name__}")
    return {rank: [str(a) for a in actions if a is not None] for rank, actions in sorted(order.items())}


def _kind(name: str) -> str:
    """'2SEND_F5' -> 'SEND_F', '1UNSHARD' -> 'UNSHARD', '0F3' -> 'F'."""
    return name.lstrip("0123456789").rstrip("0123456789")


def unshard_positions(rows: Mapping[int, Sequence[str]]) -> dict[int, list[int]]:
    """Per rank, the number of compute actions (F/B/I/W) that run before each UNSHARD: where the fetches sit."""
    out: dict[int, list[int]] = {}
    for rank, actions in rows.items():
        computed, positions = 0, []
        for name in actions:
            if _kind(name) == "UNSHARD":
                positions.append(computed)
            elif _is_compute(name):
                computed += 1
        out[rank] = positions
    return out


def _is_compute(name: str) -> bool:
    """'2F5', '2B5', '2I5', '2W5' (stage, kind, microbatch); communication actions have longer kinds."""
    return _kind(name) in {"F", "B", "I", "W"} and name[:1].isdigit() and name[-1:].isdigit()


def action_counts(rows: Mapping[int, Sequence[str]], kinds: Sequence[str]) -> dict[int, dict[str, int]]:
    """Per rank, how many actions of each kind (e.g. 'SEND_F', 'RECV_F', 'UNSHARD') the lowered schedule holds."""
    return {rank: {k: sum(1 for a in actions if _kind(a) == k) for k in kinds} for rank, actions in rows.items()}


def pending_sends(lowered: Sequence[str]) -> list[int]:
    """How many sends one rank has issued and not yet waited for, after each of its lowered actions."""
    pending: set[tuple[str, str]] = set()
    out: list[int] = []
    for name in lowered:
        kind = _kind(name)
        if kind in ("SEND_F", "SEND_B"):
            pending.add((kind, name.replace(kind, "|")))
        elif kind in ("WAIT_SEND_F", "WAIT_SEND_B"):
            pending.discard((kind[5:], name.replace(kind, "|")))
        out.append(len(pending))
    return out


def transfers(rows: Mapping[int, Sequence[str]]) -> dict[int, list[str]]:
    """Per rank, the lowered actions without the send waits: the computations, sends and receives, in order."""
    return {rank: [a for a in actions if not _kind(a).startswith("WAIT_SEND")] for rank, actions in rows.items()}


def slot_positions(grid_row: Sequence[str], lowered: Sequence[str]) -> list[float]:
    """Place each lowered action of one rank on the compute grid's time axis (`compute_grid(...)[rank]`).

    A compute action sits at its slot; a communication action half a slot after the compute action before it
    (-0.5 before the first). `lowered` is `action_rows(...)[rank]` of the same schedule.
    """
    slot_of = {a: t for t, a in enumerate(grid_row) if a}
    out: list[float] = []
    last = -0.5
    for name in lowered:
        if name in slot_of:
            last = float(slot_of[name])
            out.append(last)
        else:
            out.append(last + 0.5 if last >= 0 else -0.5)
    return out


def memory_steps(events: Sequence[tuple[int, int]], positions: Sequence[float]) -> tuple[list[float], list[int]]:
    """A tracker's `(action, bytes)` events as a step curve on the compute grid's time axis (x, bytes)."""
    xs: list[float] = []
    ys: list[int] = []
    for action, total in events:
        x = positions[action] if 0 <= action < len(positions) else -1.0
        xs.append(x)
        ys.append(total)
    return xs, ys


def compute_grid(order: Mapping[int, Sequence[Any | None]]) -> dict[int, list[str]]:
    """A schedule's compute grid (`pipeline_order`: one list per rank, a time slot each) as strings, "" for idle."""
    if not isinstance(order, Mapping):
        raise ValueError(f"compute_grid(): order must map rank -> actions (pipeline_order), got {type(order).__name__}")
    return {rank: ["" if a is None else str(a) for a in actions] for rank, actions in sorted(order.items())}


_COMPUTE = re.compile(r"(\d+)([FBIW])(\d+)\Z")


def bubble_fraction(grid: Mapping[int, Sequence[str]]) -> float:
    """The share of the grid's rank x slot cells that are idle, up to the last busy slot of any rank."""
    if not grid:
        raise ValueError("bubble_fraction(): grid must map at least one rank to its slots")
    end = max((t + 1 for row in grid.values() for t, a in enumerate(row) if a), default=0)
    if end == 0:
        raise ValueError("bubble_fraction(): the grid has no compute action")
    idle = sum(1 for row in grid.values() for t in range(end) if t >= len(row) or not row[t])
    return idle / (end * len(grid))


def draw_schedule(grid: Mapping[int, Sequence[str]], *, slots: int | None = None, width: float = 7.2,
                  title: str | None = None):
    """A compute grid (`compute_grid`) drawn as time slots x ranks: forwards blue, backwards orange, the rank's
    later stage in the lighter tone, the microbatch number in each cell, idle slots (the bubble) left white.

    Returns (fig, ax) from `pt215.diagrams.cell_grid`, with a legend.
    """
    from matplotlib.patches import Patch

    from pt215.diagrams import cell_grid, color

    if not isinstance(grid, Mapping) or not grid:
        raise ValueError("draw_schedule(): grid must map rank -> slot names (compute_grid of pipeline_order)")
    ranks = sorted(grid)
    n = max(len(grid[r]) for r in ranks) if slots is None else slots
    cells, tones = [], []
    for r in ranks:
        row = list(grid[r])[:n] + [""] * max(0, n - len(grid[r]))
        parsed = [_COMPUTE.match(a) if a else None for a in row]
        bad = [a for a, m in zip(row, parsed, strict=True) if a and m is None]
        if bad:
            raise ValueError(f"draw_schedule(): rank {r} has slots that are not compute actions: {bad[:3]}")
        first = min((int(m.group(1)) for m in parsed if m), default=0)
        cells.append(["" if m is None else m.group(3) for m in parsed])
        tones.append([None if m is None else _tone(m.group(2), int(m.group(1)) != first) for m in parsed])
    fig, ax = cell_grid(cells, tones=tones, row_labels=[f"rank {r}" for r in ranks], width=width,
                        cell_height=0.5, fontsize=6, xlabel="time slot of the schedule (white: idle, the bubble)",
                        title=title)
    ax.legend(handles=[Patch(facecolor=color(c), alpha=0.55, label=t) for c, t in (
        ("blue", "forward, first stage"), ("sky", "forward, later stage"), ("vermillion", "backward, first stage"),
        ("orange", "backward, later stage"))], loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=4,
        frameon=False, fontsize=8)
    return fig, ax


def _tone(kind: str, later: bool) -> str:
    if kind == "F":
        return "sky" if later else "blue"
    return "orange" if later else "vermillion"
