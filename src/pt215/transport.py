"""Helpers for one-sided transfers with `torch.distributed._transport` (chapter 3, NIXL transfers).

`torch.distributed._transport` is private and API-unstable in torch 2.15; this module keeps the chapter's
scripts short and puts the few things they share in one tested place:

- control plane: `control_store` (a TCPStore of its own), `pair` (a bounded `new_transport_rank`),
  `publish` / `fetch` (remote descriptors through a store, with timeouts), `wait_key`;
- the KV-cache example: `KVConfig`, `make_weights`, `prefill_layer`, `prefill`, `decode_step`, `layer_slices`,
  `pack_layer`, `unpack_layer`, `digest`;
- `describe` (an exception as `Type: first line`), `quiet_nixl` (NIXL's Python logger writes INFO lines
  with timestamps and agent names to stdout; quiet it before any transport is made).

Timing is not here: the chapter's scripts time transfers with `pt215.timing.time_samples`, and compare a
transfer's payload rate with a local copy's, `pt215.roofline.copy_bandwidth() / 2` (see its docstring).
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "KVConfig",
    "control_store",
    "decode_step",
    "describe",
    "digest",
    "fetch",
    "layer_slices",
    "make_weights",
    "nixl_available",
    "pack_layer",
    "pair",
    "prefill",
    "prefill_layer",
    "publish",
    "quiet_nixl",
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
         **options: Any) -> Any:
    """Connect this process to `peer_rank` with `new_transport_rank` (chapter 3), bounded by `timeout`.

    `store=None` uses the process group's store. `timeout` bounds bootstrap (each of bind, the store wait,
    connect) and becomes the transport's default per-operation timeout; a missing peer raises `TimeoutError`.
    Extra `options` go to the backend (for NIXL: `plugin`, `agent_name`, `num_threads`, ...).
    """
    from torch.distributed._transport import new_transport_rank

    _check_rank(peer_rank, "peer_rank")
    if rank is not None:
        _check_rank(rank, "rank")
        if rank == peer_rank:
            raise ValueError(f"peer_rank must differ from rank, both are {rank}")
    timeout = _check_timeout(timeout)
    quiet_nixl()
    options.setdefault("timeout", timeout)
    try:
        return new_transport_rank(backend, device, store=store, peer_rank=peer_rank, rank=rank,
                                  bootstrap_timeout=timeout, **options)
    except dist.DistStoreError as e:
        raise TimeoutError(f"peer rank {peer_rank} did not publish its connection bytes within {timeout:g} s "
                           "(is it running, and using the same store?)") from e


def wait_key(store: dist.Store, key: str, *, timeout: float = 30.0) -> bytes:
    """Wait at most `timeout` seconds for `key` in `store` and return its value.

    Raises `TimeoutError` naming the key (the store's own error says only "Wait timeout").
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
