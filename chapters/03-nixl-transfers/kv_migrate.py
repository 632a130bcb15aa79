"""KV-cache migration, prefill -> decode, one-sided (chapter 3).

    torchrun --nproc-per-node 2 kv_migrate.py [--layers 8 --heads 8 --head-dim 64 --seq 512]

Rank 0 (prefill) runs causal attention layer by layer over a seeded prompt. As soon as a layer's KV block
exists it registers it and publishes its descriptor and a SHA-256 fingerprint in the store, then moves on
to the next layer, and afterwards to other requests: it never calls the transport for the decode side.
Rank 1 (decode) pulls each layer with a one-sided read into its own byte range of one flat buffer as soon
as the descriptor appears, verifies every block bit-exactly, and computes the next token's attention
output from the pulled cache, which must equal, bit for bit, what prefill computes from its own cache.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from pt215.cpu_kernels import kernel_value
from pt215.launch import init_rank, report, shutdown
from pt215.transport import (
    KVConfig,
    decode_step,
    digest,
    fetch,
    make_weights,
    pack_layer,
    pair,
    prefill,
    prefill_layer,
    publish,
    quiet_nixl,
    unpack_layer,
    wait_key,
)

TIMEOUT = 30.0


def prefill_side(t: Any, store: dist.Store, cfg: KVConfig, w: dict[str, torch.Tensor], seed: int) -> dict[str, Any]:
    """Rank 0: publish each layer's KV block as it is computed, then serve other requests until decode has it."""
    h, mems, blocks, spans = w["x"][: cfg.seq], [], [], []
    # Layer by layer, as a real prefill would: publish each layer's block as soon as it exists.
    for layer in range(cfg.layers):
        start = time.monotonic()
        h, block = prefill_layer(cfg, w, h, layer)
        blocks.append(block)
        mems.append(t.register_memory(pack_layer(block)))
        store.set(f"kv/req0/digest{layer}", digest(block))
        spans.append((start, time.monotonic()))     # stamped before publishing: decode's pull starts later
        publish(store, f"kv/req0/layer{layer}", mems[-1])
    ref = decode_step(cfg, w, blocks)               # prefill's own answer for the next token
    store.set("kv/req0/next", ref.numpy().tobytes())
    print(f"prefill: published {cfg.layers} layer descriptors; now serving other requests")
    # Keep working (other requests) until decode says it has the cache. No transport call in this loop.
    extra, busy_from = 0, time.monotonic()
    while not store.check(["kv/req0/pulled"]) and time.monotonic() - busy_from < TIMEOUT:
        prefill(cfg, make_weights(cfg, seed=seed + 1 + extra))
        extra += 1
    print("prefill: decode says it has the cache")
    # Only now is it safe to drop the cache: decode has said it stopped reading.
    for mem in mems:
        t.unregister_memory(mem)
    print("prefill: unregistered request 0's KV blocks")
    return {"role": "prefill", "layer_spans": spans, "extra_requests": extra, "busy": (busy_from, time.monotonic())}


def decode_side(t: Any, store: dist.Store, cfg: KVConfig, w: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Rank 1: pull every layer one-sided into one flat buffer, verify it, decode the next token from it."""
    flat = torch.empty(cfg.layers * cfg.layer_bytes, dtype=torch.uint8)
    flat_mem = t.register_memory(flat)              # one registration, one byte range per layer
    spans = []
    for layer in range(cfg.layers):
        remote = fetch(store, f"kv/req0/layer{layer}", timeout=TIMEOUT)   # waits until prefill published it
        start = time.monotonic()
        view = flat_mem.to_mutable_view(layer * cfg.layer_bytes, cfg.layer_bytes)
        t.read(view, remote)                                               # one-sided pull of this layer
        spans.append((start, time.monotonic()))
    store.set("kv/req0/pulled", b"1")               # tell prefill it may drop its copy
    cache = [unpack_layer(flat, cfg, layer) for layer in range(cfg.layers)]
    same = [digest(cache[layer]) == wait_key(store, f"kv/req0/digest{layer}", timeout=TIMEOUT).decode()
            for layer in range(cfg.layers)]
    print(f"decode: pulled {cfg.layers} layers ({cfg.layers * cfg.layer_bytes / 2**20:g} MiB) "
          f"with one-sided reads")
    print(f"decode: every block bit-exact (SHA-256 matches prefill's): {all(same)}")
    mine = decode_step(cfg, w, cache)
    ref = torch.frombuffer(bytearray(wait_key(store, "kv/req0/next", timeout=TIMEOUT)),
                           dtype=cfg.dtype).view(1, cfg.dim)
    print(f"decode: next-token attention output equals prefill's, bit for bit: {torch.equal(mine, ref)}")
    # the attention output's last digits depend on the CPU's kernels (pt215.cpu_kernels): printed with '≈'
    print(f"decode: output[0, :4] = [{', '.join(kernel_value(x) for x in mine[0, :4].tolist())}]")
    t.unregister_memory(flat_mem)
    return {"role": "decode", "bit_exact": all(same), "same_output": torch.equal(mine, ref),
            "layer_spans": spans, "mib": cfg.layers * cfg.layer_bytes / 2**20,
            "out4": mine[0, :4].tolist()}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    cfg = KVConfig(layers=a.layers, heads=a.heads, head_dim=a.head_dim, seq=a.seq)  # checks the sizes
    quiet_nixl()
    rank = init_rank("gloo").rank
    store = dist.distributed_c10d._get_default_store()
    torch.manual_seed(a.seed)
    w = make_weights(cfg, seed=a.seed)                # both sides serve the same model
    t = pair(1 - rank, rank=rank, timeout=TIMEOUT, agent_name=("prefill" if rank == 0 else "decode"))
    role = "prefill" if rank == 0 else "decode"
    print(f"{role}: {cfg.layers} layers x {cfg.layer_bytes // 1024} KiB KV blocks "
          f"(shape {cfg.layer_shape}, {str(cfg.dtype).removeprefix('torch.')})")
    result = prefill_side(t, store, cfg, w, a.seed) if rank == 0 else decode_side(t, store, cfg, w)

    dist.barrier()                                      # nobody closes while the other may still touch it
    t.close(timeout=TIMEOUT)
    report(result)
    shutdown()  # barrier, all ranks confirm, then destroy (a clean gloo teardown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
