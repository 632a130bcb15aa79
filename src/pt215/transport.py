"""Helpers for one-sided transfers with `torch.distributed._transport` (chapter 3, NIXL transfers).

`torch.distributed._transport` is private and API-unstable in torch 2.15; this module keeps the chapter's
scripts short and puts the few things they share in one tested place:

- control plane: `control_store` (a TCPStore of its own), `pair` (a bounded `new_transport_rank`),
  `publish` / `fetch` (remote descriptors through a store, with timeouts), `wait_key`;
- the KV-cache example: `KVConfig`, `make_weights`, `prefill_layer`, `prefill`, `decode_step`, `layer_slices`,
  `pack_layer`, `unpack_layer`, `digest`;
- what carried the bytes and what it cost the peer: `ucx_protocols` (UCX's own report, `UCX_PROTO_INFO=y`),
  `tcp_socket_bytes` (the bytes this process's TCP sockets carried, from the kernel's `TCP_INFO`: the check on
  that report), `thread_times` / `thread_activity` (each thread's time on a CPU and waiting for one, from Linux's
  scheduler counters: NIXL's progress thread is always runnable);
- the chapter's pictures: `transfer_timeline` (one-sided against two-sided, from a run's timestamps),
  `kv_migration_diagram` (which bytes go where) and `kv_timeline` (prefill's compute against decode's pulls);
- `describe` (an exception as `Type: first line`), `quiet_nixl` (NIXL's Python logger writes INFO lines
  with timestamps and agent names to stdout; quiet it before any transport is made).

Timing is not here: the chapter's scripts time transfers with `pt215.timing.time_samples`, and compare a
transfer's payload rate with a local copy's, `pt215.roofline.copy_bandwidth() / 2` (see its docstring).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import socket
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "KVConfig",
    "ThreadActivity",
    "ThreadTimes",
    "control_store",
    "decode_step",
    "describe",
    "digest",
    "fetch",
    "kv_migration_diagram",
    "kv_timeline",
    "layer_slices",
    "make_weights",
    "nixl_available",
    "pack_layer",
    "pair",
    "prefill",
    "prefill_layer",
    "publish",
    "quiet_nixl",
    "tcp_socket_bytes",
    "thread_activity",
    "thread_times",
    "transfer_timeline",
    "ucx_protocols",
    "unpack_layer",
    "wait_key",
]


# ---------------------------------------------------------------- small utilities


def describe(error: BaseException) -> str:
    """`Type: first line of the message`: how the chapter prints an error (never a traceback)."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ").rstrip()


def quiet_nixl(level: str = "WARN") -> None:
    """Silence NIXL's INFO logging (it goes to stdout, with timestamps and agent names).

    Sets `NIXL_LOG_LEVEL` for this process and its children, and lowers the `nixl` logger if NIXL is already
    imported. Call it before the first transport is created.
    """
    levels = {"TRACE": 10, "DEBUG": 10, "INFO": 20, "WARN": 30, "ERROR": 40, "FATAL": 50}
    if level.upper() not in levels:
        raise ValueError(f"quiet_nixl(): level must be one of {sorted(levels)}, got {level!r}")
    os.environ["NIXL_LOG_LEVEL"] = level.upper()
    import logging

    logging.getLogger("nixl").setLevel(levels[level.upper()])


def nixl_available() -> bool:
    """True when the `nixl` package imports and torch's NIXL transport says it is supported."""
    try:
        from torch.distributed._transport.nixl import NIXLTransport
    except ImportError:
        return False
    return NIXLTransport.supported()


def _check_timeout(timeout: float, name: str = "timeout") -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not math.isfinite(timeout) \
            or timeout <= 0:
        raise ValueError(f"{name} must be a positive, finite number of seconds, got {timeout!r}")
    return float(timeout)


def _check_rank(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return value


# ---------------------------------------------------------------- control plane


def control_store(rank: int, *, via: dist.Store | None = None, key: str = "pt215/control_store",
                  host: str | None = None, timeout: float = 30.0) -> dist.TCPStore:
    """A TCPStore of its own for the transport's control plane (separate from the process group's store).

    Rank 0 hosts it on a free port and announces `host:port` under `key` in `via` (default: the process
    group's store); other ranks wait at most `timeout` seconds for that key and connect as clients. `host` is
    the address the other ranks reach rank 0 at: by default `MASTER_ADDR` (set by torchrun to rank 0's node,
    so the store works across nodes), else 127.0.0.1 (one machine).
    """
    _check_rank(rank, "rank")
    _check_timeout(timeout)
    via = dist.distributed_c10d._get_default_store() if via is None else via
    delta = timedelta(seconds=timeout)
    if rank == 0:
        public = host or os.environ.get("MASTER_ADDR") or "127.0.0.1"
        store = dist.TCPStore(public, 0, is_master=True, wait_for_workers=False, timeout=delta)
        via.set(key, f"{public}:{store.port}")
        return store
    public, _, port = wait_key(via, key, timeout=timeout).decode().rpartition(":")
    return dist.TCPStore(host or public or "127.0.0.1", int(port), is_master=False, timeout=delta)


def pair(peer_rank: int, *, rank: int | None = None, store: dist.Store | None = None,
         device: str | torch.device = "cpu", backend: str = "nixl", timeout: float = 30.0,
         op_timeout: float | None = None, **options: Any) -> Any:
    """Connect this process to `peer_rank` with `new_transport_rank` (chapter 3), bounded by `timeout`.

    `store=None` uses the process group's store. `timeout` bounds bootstrap (each of bind, the store wait,
    connect); a missing peer raises `TimeoutError`. `op_timeout` (default: `timeout`) is the transport's default
    timeout of every later operation, `close()` and `with transport:` included. Extra `options` go to the
    backend (for NIXL: `plugin`, `agent_name`, `num_threads`, `enable_prog_thread`, ...).
    """
    from torch.distributed._transport import new_transport_rank

    _check_rank(peer_rank, "peer_rank")
    if rank is not None:
        _check_rank(rank, "rank")
        if rank == peer_rank:
            raise ValueError(f"peer_rank must differ from rank, both are {rank}")
    timeout = _check_timeout(timeout)
    options["timeout"] = timeout if op_timeout is None else _check_timeout(op_timeout, "op_timeout")
    quiet_nixl()
    try:
        return new_transport_rank(backend, device, store=store, peer_rank=peer_rank, rank=rank,
                                  bootstrap_timeout=timeout, **options)
    except dist.DistStoreError as e:
        raise TimeoutError(f"peer rank {peer_rank} did not publish its connection bytes within {timeout:g} s "
                           "(is it running, and using the same store?)") from e


def wait_key(store: dist.Store, key: str, *, timeout: float = 30.0) -> bytes:
    """Wait at most `timeout` seconds for `key` in `store` and return its value.

    Raises `TimeoutError` naming the key and the wait in seconds, with the store's own `DistStoreError` as its
    cause (a TCPStore's says "wait timeout after 2000ms, keys: /the/key"; a HashStore's does not name the key).
    """
    _check_timeout(timeout)
    if not isinstance(key, str) or not key:
        raise ValueError(f"key must be a non-empty string, got {key!r}")
    try:
        store.wait([key], timedelta(seconds=timeout))
    except dist.DistStoreError as e:
        raise TimeoutError(f"key {key!r} did not appear in the store within {timeout:g} s") from e
    return store.get(key)


def publish(store: dist.Store, key: str, memory: Any) -> bytes:
    """Put the remote descriptor of registered `memory` into `store` under `key`; return the bytes.

    The bytes grant the peer read and write access to that memory: publish only to trusted peers.
    """
    if not hasattr(memory, "to_remote_buffer"):
        raise TypeError(f"memory must be registered memory (from Transport.register_memory), got "
                        f"{type(memory).__name__}")
    data = memory.to_remote_buffer().serialize()
    store.set(key, data)
    return data


def fetch(store: dist.Store, key: str, *, timeout: float = 30.0) -> Any:
    """Wait at most `timeout` seconds for a descriptor published under `key` and deserialize it."""
    from torch.distributed._transport.nixl import NIXLRemoteBuffer

    return NIXLRemoteBuffer.deserialize(wait_key(store, key, timeout=timeout))


# ---------------------------------------------------------------- the KV-cache example


@dataclass(frozen=True)
class KVConfig:
    """Shape of the chapter's small attention model: `layers` layers of `heads` x `head_dim` attention."""

    layers: int = 4
    heads: int = 4
    head_dim: int = 16
    seq: int = 128
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        for name in ("layers", "heads", "head_dim", "seq"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"KVConfig.{name} must be a positive int, got {v!r}")
        if not self.dtype.is_floating_point:
            raise ValueError(f"KVConfig.dtype must be a floating dtype, got {self.dtype}")

    @property
    def dim(self) -> int:
        """Model width, `heads * head_dim`."""
        return self.heads * self.head_dim

    @property
    def layer_shape(self) -> tuple[int, int, int, int]:
        """Shape of one layer's KV block: (2 for K and V, heads, seq, head_dim)."""
        return (2, self.heads, self.seq, self.head_dim)

    @property
    def layer_bytes(self) -> int:
        """Bytes of one layer's KV block."""
        return math.prod(self.layer_shape) * torch.empty((), dtype=self.dtype).element_size()


def make_weights(cfg: KVConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded weights: an input sequence `x` (seq+1 tokens; the last one is decoded) and per-layer projections."""
    g = torch.Generator().manual_seed(seed)
    d = cfg.dim
    scale = 1.0 / math.sqrt(d)

    def rnd(*shape: int, s: float = scale) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * s).to(cfg.dtype)

    return {"x": rnd(cfg.seq + 1, d, s=1.0), "wq": rnd(cfg.layers, d, d), "wk": rnd(cfg.layers, d, d),
            "wv": rnd(cfg.layers, d, d), "wo": rnd(cfg.layers, d, d)}


def _heads(t: torch.Tensor, cfg: KVConfig) -> torch.Tensor:
    return t.view(t.shape[0], cfg.heads, cfg.head_dim).transpose(0, 1)  # (heads, tokens, head_dim)


def prefill_layer(cfg: KVConfig, w: dict[str, torch.Tensor], h: torch.Tensor,
                  layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer of causal attention over hidden states `h` (seq, dim): return (next h, this layer's KV block).

    The block is contiguous with shape `cfg.layer_shape` = (2, heads, seq, head_dim): K then V.
    """
    q, k, v = (_heads(h @ w[n][layer], cfg) for n in ("wq", "wk", "wv"))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    h = h + out.transpose(0, 1).reshape(h.shape[0], cfg.dim) @ w["wo"][layer]
    return h, torch.stack([k, v]).contiguous()


def prefill(cfg: KVConfig, w: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """Run causal attention over the first `seq` tokens; return one contiguous KV block per layer."""
    h = w["x"][: cfg.seq]
    blocks = []
    for layer in range(cfg.layers):
        h, block = prefill_layer(cfg, w, h, layer)
        blocks.append(block)
    return blocks


def decode_step(cfg: KVConfig, w: dict[str, torch.Tensor], blocks: Sequence[torch.Tensor]) -> torch.Tensor:
    """Attention output for token `seq` (the next token), reading K/V of earlier tokens from `blocks`."""
    if len(blocks) != cfg.layers:
        raise ValueError(f"decode_step(): expected {cfg.layers} KV blocks, got {len(blocks)}")
    h = w["x"][cfg.seq : cfg.seq + 1]
    for layer, block in enumerate(blocks):
        if tuple(block.shape) != cfg.layer_shape or block.dtype != cfg.dtype:
            raise ValueError(f"decode_step(): block {layer} has shape {tuple(block.shape)} and dtype "
                             f"{block.dtype}, expected {cfg.layer_shape} and {cfg.dtype}")
        q, k, v = (_heads(h @ w[n][layer], cfg) for n in ("wq", "wk", "wv"))
        k_all = torch.cat([block[0], k], dim=1)
        v_all = torch.cat([block[1], v], dim=1)
        out = torch.nn.functional.scaled_dot_product_attention(q, k_all, v_all)
        h = h + out.transpose(0, 1).reshape(1, cfg.dim) @ w["wo"][layer]
    return h


def layer_slices(cfg: KVConfig) -> list[tuple[int, int]]:
    """Byte range `(offset, length)` of each layer's block in a flat buffer holding all layers."""
    return [(i * cfg.layer_bytes, cfg.layer_bytes) for i in range(cfg.layers)]


def pack_layer(block: torch.Tensor) -> torch.Tensor:
    """A KV block as a flat contiguous uint8 tensor (what gets registered and moved: bytes, not shapes)."""
    if not block.is_contiguous():
        raise ValueError("pack_layer(): block must be contiguous (a transport moves a byte range)")
    return block.view(-1).view(torch.uint8)


def unpack_layer(flat: torch.Tensor, cfg: KVConfig, layer: int) -> torch.Tensor:
    """View layer `layer` of a flat uint8 buffer (all layers back to back) as a KV block; no copy."""
    if flat.dtype != torch.uint8 or flat.dim() != 1:
        raise ValueError(f"unpack_layer(): flat must be a 1-D uint8 tensor, got {flat.dtype} "
                         f"with {flat.dim()} dims")
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < cfg.layers:
        raise ValueError(f"unpack_layer(): layer must be an int in [0, {cfg.layers}), got {layer!r}")
    need = cfg.layers * cfg.layer_bytes
    if flat.numel() < need:
        raise ValueError(f"unpack_layer(): flat has {flat.numel()} bytes, the config needs {need}")
    offset, length = layer_slices(cfg)[layer]
    return flat[offset : offset + length].view(cfg.dtype).view(cfg.layer_shape)


def digest(t: torch.Tensor) -> str:
    """First 16 hex digits of the SHA-256 of a CPU tensor's bytes: a bit-exact fingerprint to compare across
    processes."""
    if t.device.type != "cpu":
        raise ValueError(f"digest(): expected a CPU tensor, got one on {t.device}")
    data = t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


# ---------------------------------------------------------------- what carried the bytes, what it cost the peer

_UCX_ROW = re.compile(r"\|\s*(?P<range>[\d.]+\.\.(?:inf|\d+)|\d+)\s*\|\s*(?P<how>[^|]+?)\s*\|\s*(?P<via>[^|]+?)\s*\|")


def ucx_protocols(lines: Iterable[str], *, operations: str = "remote memory") -> dict[str, list[tuple[str, str, str]]]:
    """The protocols UCX chose, from its own report (`UCX_PROTO_INFO=y` makes UCX print them on stdout).

    Returns `{operation: [(size range, method, transport), ...]}` for each operation whose title starts with
    `operations` (default: the one-sided `ucp_put*` / `ucp_get*` ones NIXL's writes and reads use), e.g.
    `{"remote memory write by ucp_put* from host memory to host": [("0..inf", "zero-copy", "cma/memory")]}`.
    Lines may carry UCX's `[time] [host:pid]` prefix; repeated tables (one per endpoint) are merged.
    """
    if not isinstance(operations, str) or not operations:
        raise ValueError(f"ucx_protocols(): operations must be a non-empty string, got {operations!r}")
    found: dict[str, list[tuple[str, str, str]]] = {}
    current: str | None = None
    for raw in lines:
        line = raw[raw.find("|"):] if "|" in raw else ""
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line else []
        if len(cells) == 1 and cells[0]:
            title = cells[0]
            if title.startswith(operations):
                current = title
                found.setdefault(current, [])
            elif not title.startswith(("Range", "+")) and " cfg#" not in title:
                current = None
            continue
        m = _UCX_ROW.search(line)
        if current is not None and m and m.group("range") != "Range":
            row = (m.group("range"), m.group("how"), m.group("via"))
            if row not in found[current]:
                found[current].append(row)
    return found


# struct tcp_info (linux/tcp.h): tcpi_bytes_acked and tcpi_bytes_received, two u64 at byte 120 (Linux >= 4.1)
_TCPI_BYTES_AT, _TCPI_LEN = 120, 136


def tcp_socket_bytes() -> int | None:
    """Bytes this process's TCP sockets have carried so far: for each, the payload the peer acknowledged plus the
    payload received (the kernel's `TCP_INFO`, `tcpi_bytes_acked + tcpi_bytes_received`), summed.

    Counts sockets opened by native libraries too (UCX's TCP transport, gloo, a `TCPStore`), and only this
    process's: other jobs on the machine do not move it. The difference over a window in which only NIXL
    transfers ran says whether their bytes crossed a socket. None where Linux's `/proc/self/fd` or `TCP_INFO`
    is not available.
    """
    if not hasattr(socket, "TCP_INFO") or not Path("/proc/self/fd").is_dir():
        return None
    total = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=int(fd))         # wraps the descriptor; detach() below never closes it
        except OSError:
            continue
        try:
            if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM:
                info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
                if len(info) >= _TCPI_LEN:
                    total += sum(struct.unpack_from("=QQ", info, _TCPI_BYTES_AT))
        except OSError:
            pass
        finally:
            sock.detach()
    return total


@dataclass(frozen=True)
class ThreadTimes:
    """One thread's scheduler counters (Linux): seconds on a CPU, seconds runnable but waiting for one, and how
    many times it gave the CPU up by itself (blocked or slept)."""

    on_cpu_s: float
    waiting_s: float
    voluntary: int


@dataclass(frozen=True)
class ThreadActivity:
    """What one thread did over a window, as fractions of the window's wall time."""

    on_cpu: float
    waiting: float
    voluntary: int

    @property
    def runnable(self) -> float:
        """Share of the window the thread wanted a CPU (on one, or waiting for one): about 1 for a thread that
        never sleeps, about 0 for one that sleeps. On a heavily loaded virtual machine the two counters can miss
        part of the window, so a spinning thread can read well below 1: tell it by `voluntary` too."""
        return self.on_cpu + self.waiting


def thread_times(pid: int | str = "self") -> dict[int, ThreadTimes]:
    """Every thread of process `pid` (default: this one) with its `ThreadTimes`, read from
    `/proc/<pid>/task/<tid>/schedstat` and `status`; an empty dict where Linux's scheduler statistics are not
    available (another OS, or a kernel without them). Threads that end while being read are left out."""
    if not (isinstance(pid, int) and not isinstance(pid, bool) and pid > 0) and pid != "self":
        raise ValueError(f"thread_times(): pid must be a positive int or 'self', got {pid!r}")
    tasks = Path(f"/proc/{pid}/task")
    out: dict[int, ThreadTimes] = {}
    if not tasks.is_dir():
        return out
    for task in tasks.iterdir():
        try:
            run_ns, wait_ns, _ = (int(v) for v in (task / "schedstat").read_text().split()[:3])
            status = (task / "status").read_text()
        except (OSError, ValueError):
            continue
        m = re.search(r"^voluntary_ctxt_switches:\s*(\d+)", status, flags=re.M)
        out[int(task.name)] = ThreadTimes(run_ns / 1e9, wait_ns / 1e9, int(m.group(1)) if m else 0)
    return out


def thread_activity(before: Mapping[int, ThreadTimes], after: Mapping[int, ThreadTimes],
                    seconds: float) -> dict[int, ThreadActivity]:
    """Per thread alive at both snapshots: its time on a CPU and waiting for one over a window of `seconds`,
    as fractions of it, and its voluntary switches in the window."""
    _check_timeout(seconds, "seconds")
    return {tid: ThreadActivity((after[tid].on_cpu_s - b.on_cpu_s) / seconds,
                                (after[tid].waiting_s - b.waiting_s) / seconds,
                                after[tid].voluntary - b.voluntary)
            for tid, b in before.items() if tid in after}


# ---------------------------------------------------------------- the chapter's pictures


def transfer_timeline(two_sided: Mapping[str, float], one_sided: Mapping[str, float]):
    """One round of each protocol, drawn from a run's timestamps (seconds on one clock shared by both ranks).

    `two_sided`: `send`, `sent`, `acked` (rank 0) and `recv`, `received`, `ack_sent` (rank 1); `one_sided`:
    `write`, `written` (rank 0) and `seen` (when rank 1, which made no call, noticed its memory had changed).
    Two panels, each in milliseconds since that protocol's first call; returns `(fig, (ax_two, ax_one))`.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from pt215.diagrams import color
    from pt215.figures import use_style

    need2 = ("send", "sent", "acked", "recv", "received", "ack_sent")
    need1 = ("write", "written", "seen")
    missing = [k for k in need2 if k not in two_sided] + [k for k in need1 if k not in one_sided]
    if missing:
        raise ValueError(f"transfer_timeline(): missing timestamps {missing}")
    d, o = two_sided, one_sided
    t2, t1 = min(d["send"], d["recv"]), o["write"]
    panels = [
        ("two-sided: gloo send + 1-byte ack", t2,
         [(0, d["send"], d["sent"], "send", "blue"), (0, d["sent"], d["acked"], "wait for ack", "sky"),
          (1, d["recv"], d["received"], "recv (must be in it)", "orange"),
          (1, d["received"], d["ack_sent"], "send ack", "vermillion")], None),
        ("one-sided: NIXL write", t1,
         [(0, o["write"], o["written"], "write: returns when the bytes have landed", "blue"),
          (1, o["write"], max(o["written"], o["seen"]), "no call", "grey")], o["seen"]),
    ]
    use_style()
    fig, axes = plt.subplots(2, 1, figsize=(7.0, 3.6))
    for ax, (title, t0, bars, seen) in zip(axes, panels, strict=True):
        span = max(end for _, _, end, _, _ in bars) - t0
        for lane, start, end, label, tone in bars:
            y = 1 - lane
            ax.barh(y, (end - start) * 1e3, left=(start - t0) * 1e3, height=0.6, color=color(tone), alpha=0.85,
                    edgecolor="black", linewidth=0.5, hatch="//" if tone == "grey" else None)
            wide = (end - start) > 0.3 * span  # a narrow bar gets its label above it
            ax.text((((start + end) / 2 if wide else start) - t0) * 1e3, y if wide else y + 0.34, label,
                    ha="center" if wide else "left", va="center" if wide else "bottom", fontsize=8)
        if seen is not None:
            ax.plot([(seen - t0) * 1e3] * 2, [-0.35, 0.35], color="black", lw=1.5)
            ax.text((seen - t0) * 1e3, -0.45, "rank 1 notices its new bytes", fontsize=8, ha="right", va="top")
        ax.set_yticks([1, 0], ["rank 0 (initiator)", "rank 1 (owner)"])
        ax.set_ylim(-0.8, 1.75)
        ax.set_xlim(0, span * 1e3 * 1.45)
        ax.set_title(title, fontsize=10, loc="left")
        ax.grid(axis="y", visible=False)
    axes[1].set_xlabel("ms since the protocol's first call (each panel its own scale)")
    fig.legend(handles=[Patch(facecolor=color(c), label=t) for c, t in (
        ("blue", "initiator's call"), ("sky", "initiator waits for the peer"), ("orange", "peer's matching call"),
        ("grey", "peer makes no call"))], loc="lower center", ncol=4, frameon=False, fontsize=8,
        bbox_to_anchor=(0.5, -0.06))
    fig.tight_layout()
    return fig, tuple(axes)


def kv_migration_diagram(cfg: KVConfig, shown: int = 3):
    """Which bytes go where in chapter 3's migration: prefill's per-layer KV blocks, each registered on its own
    and announced by a descriptor in the store; decode's one flat buffer, where layer l lands at byte
    l * layer_bytes (`layer_slices`). Drawn from `cfg`; the first `shown` layers and the last are drawn."""
    from pt215.diagrams import arrow, box, canvas, note

    if isinstance(shown, bool) or not isinstance(shown, int) or shown < 1:
        raise ValueError(f"kv_migration_diagram(): shown must be a positive int, got {shown!r}")
    layers = list(range(min(shown, cfg.layers)))
    if cfg.layers > len(layers):
        layers.append(cfg.layers - 1)
    fig, ax = canvas(7.2, 3.4, xlim=(0, 12), ylim=(0, 6.2))
    note(ax, 1.7, 5.9, "prefill (owner): one block per layer", fontsize=9)
    note(ax, 6.0, 5.9, "store (control plane)", fontsize=9)
    note(ax, 10.2, 5.9, "decode (initiator): one buffer", fontsize=9)
    box(ax, 8.7, 0.3, 3.0, 5.2, "", fill="green", alpha=0.08)
    kib = cfg.layer_bytes / 1024
    for i, layer in enumerate(layers):
        y = 4.6 - i * 1.25
        label = f"layer {layer}: K,V {tuple(cfg.layer_shape)}" if i == 0 else f"layer {layer}"
        box(ax, 0.1, y, 3.2, 0.8, label, fill="blue", fontsize=8)
        box(ax, 4.6, y, 2.8, 0.8, f"kv/req0/layer{layer}", fill="yellow", fontsize=8, rounded=False)
        off, _ = layer_slices(cfg)[layer]
        box(ax, 8.9, y, 2.6, 0.8, f"bytes {off:,}..", fill="green", fontsize=8, rounded=False, alpha=0.3)
        arrow(ax, (3.3, y + 0.4), (4.6, y + 0.4), "publish", fontsize=7, tone="grey")
        arrow(ax, (7.4, y + 0.4), (8.9, y + 0.4), "fetch", fontsize=7, tone="grey")
        arrow(ax, (3.3, y + 0.15), (8.9, y + 0.15), "", dashed=True, tone="vermillion")
        if i == len(layers) - 2 and layers[-1] != layers[-2] + 1:
            note(ax, 1.7, y - 0.25, "...", fontsize=10)
    note(ax, 6.0, 0.15, f"dashed: read(), one-sided, {kib:g} KiB per layer (decode's call only)", fontsize=8,
         tone="vermillion")
    return fig, ax


def kv_timeline(prefill_spans: Sequence[Sequence[float]], decode_spans: Sequence[Sequence[float]]):
    """Prefill's compute of each layer against decode's pull of it, from a run's (start, end) timestamps on one
    clock; milliseconds since prefill started layer 0. Returns `(fig, ax)`."""
    from pt215.diagrams import Span, timeline

    if not prefill_spans or len(prefill_spans) != len(decode_spans):
        raise ValueError(f"kv_timeline(): need one span per layer on both sides, got {len(prefill_spans)} and "
                         f"{len(decode_spans)}")
    t0 = prefill_spans[0][0]
    spans = [Span(0, (a - t0) * 1e3, (b - t0) * 1e3, str(i), "blue") for i, (a, b) in enumerate(prefill_spans)]
    spans += [Span(1, (a - t0) * 1e3, (b - t0) * 1e3, str(i), "orange") for i, (a, b) in enumerate(decode_spans)]
    return timeline(["prefill: compute layer", "decode: pull layer"], spans,
                    xlabel="ms since prefill started layer 0",
                    legend={"blue": "prefill computes and registers (then publishes)",
                            "orange": "decode's read() of it"})
