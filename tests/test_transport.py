"""Tests for pt215.transport (chapter 3: one-sided transfers with NIXL)."""

from __future__ import annotations

import threading
import time

import pytest
import torch
import torch.distributed as dist

from pt215 import transport as tr

needs_nixl = pytest.mark.skipif(not tr.nixl_available(), reason="needs the nixl package")


# ---------------------------------------------------------------- small utilities


@pytest.mark.parametrize(
    ("error", "text"),
    [
        (ValueError("bad thing\nmore detail"), "ValueError: bad thing"),
        (TimeoutError("transport wait timed out; operation remains pending"),
         "TimeoutError: transport wait timed out; operation remains pending"),
        (RuntimeError(""), "RuntimeError"),
    ],
)
def test_describe(error, text):
    assert tr.describe(error) == text


def test_quiet_nixl_sets_env_and_rejects_unknown_level(monkeypatch):
    monkeypatch.delenv("NIXL_LOG_LEVEL", raising=False)
    tr.quiet_nixl("error")
    import os

    assert os.environ["NIXL_LOG_LEVEL"] == "ERROR"
    with pytest.raises(ValueError, match="level must be one of"):
        tr.quiet_nixl("LOUD")


@pytest.mark.parametrize("timeout", [0, -1, float("inf"), float("nan"), True, "3"])
def test_wait_key_rejects_bad_timeout(timeout):
    with pytest.raises(ValueError, match="timeout must be a positive, finite number"):
        tr.wait_key(dist.HashStore(), "k", timeout=timeout)


def test_wait_key_returns_value_and_times_out_naming_the_key():
    store = dist.HashStore()
    store.set("present", b"\x00\xff")
    assert tr.wait_key(store, "present", timeout=1) == b"\x00\xff"
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="'missing' did not appear in the store within 0.2 s"):
        tr.wait_key(store, "missing", timeout=0.2)
    assert time.monotonic() - t0 < 5
    with pytest.raises(ValueError, match="key must be a non-empty string"):
        tr.wait_key(store, "", timeout=1)


def test_publish_rejects_a_raw_tensor():
    with pytest.raises(TypeError, match="memory must be registered memory.*Tensor"):
        tr.publish(dist.HashStore(), "k", torch.zeros(4))


def test_fetch_rejects_malformed_bytes():
    store = dist.HashStore()
    store.set("d", b"not json")
    with pytest.raises(ValueError, match="malformed descriptor"):
        tr.fetch(store, "d", timeout=1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"peer_rank": -1}, "peer_rank must be a non-negative int"),
        ({"peer_rank": 1, "rank": 1}, "peer_rank must differ from rank"),
        ({"peer_rank": 1, "rank": 0, "timeout": 0}, "timeout must be a positive"),
        ({"peer_rank": True}, "peer_rank must be a non-negative int"),
    ],
)
def test_pair_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tr.pair(store=dist.HashStore(), **kwargs)


def test_control_store_hands_rank_1_the_port_of_rank_0s_store():
    via = dist.HashStore()
    host = tr.control_store(0, via=via, timeout=5)
    client = tr.control_store(1, via=via, timeout=5)
    client.set("x", b"1")
    assert host.get("x") == b"1"
    with pytest.raises(TimeoutError, match="did not appear"):
        tr.control_store(1, via=dist.HashStore(), timeout=0.2)


# ---------------------------------------------------------------- the KV-cache example


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"layers": 0}, "layers must be a positive int"), ({"seq": 1.5}, "seq must be a positive int"),
     ({"dtype": torch.int32}, "dtype must be a floating dtype")],
)
def test_kvconfig_validates(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tr.KVConfig(**kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kvconfig_sizes(dtype):
    cfg = tr.KVConfig(layers=3, heads=2, head_dim=8, seq=5, dtype=dtype)
    size = torch.empty((), dtype=dtype).element_size()
    assert cfg.dim == 16 and cfg.layer_shape == (2, 2, 5, 8)
    assert cfg.layer_bytes == 2 * 2 * 5 * 8 * size
    assert tr.layer_slices(cfg) == [(0, cfg.layer_bytes), (cfg.layer_bytes, cfg.layer_bytes),
                                    (2 * cfg.layer_bytes, cfg.layer_bytes)]


def test_prefill_is_seeded_and_shaped():
    cfg = tr.KVConfig(layers=2, heads=2, head_dim=4, seq=6)
    a, b = tr.prefill(cfg, tr.make_weights(cfg, 1)), tr.prefill(cfg, tr.make_weights(cfg, 1))
    c = tr.prefill(cfg, tr.make_weights(cfg, 2))
    assert all(x.shape == cfg.layer_shape and x.is_contiguous() for x in a)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])


def test_decode_step_matches_a_full_prefill_of_one_more_token():
    """Decoding token `seq` from the cache equals running causal attention over seq+1 tokens."""
    cfg = tr.KVConfig(layers=3, heads=2, head_dim=4, seq=7)
    w = tr.make_weights(cfg, 0)
    h_next = tr.decode_step(cfg, w, tr.prefill(cfg, w))
    longer = tr.KVConfig(layers=3, heads=2, head_dim=4, seq=8)
    h = w["x"][:8]
    for layer in range(3):
        h, _ = tr.prefill_layer(longer, w, h, layer)
    torch.testing.assert_close(h_next, h[-1:], rtol=1e-5, atol=1e-5)


def test_decode_step_rejects_wrong_blocks():
    cfg = tr.KVConfig(layers=2, heads=2, head_dim=4, seq=3)
    w = tr.make_weights(cfg)
    blocks = tr.prefill(cfg, w)
    with pytest.raises(ValueError, match="expected 2 KV blocks, got 1"):
        tr.decode_step(cfg, w, blocks[:1])
    with pytest.raises(ValueError, match="block 1 has shape"):
        tr.decode_step(cfg, w, [blocks[0], blocks[1][:, :, :2]])


def test_pack_unpack_roundtrip_is_bit_exact_and_copy_free():
    cfg = tr.KVConfig(layers=3, heads=2, head_dim=4, seq=5)
    blocks = tr.prefill(cfg, tr.make_weights(cfg, 3))
    flat = torch.cat([tr.pack_layer(b) for b in blocks])
    assert flat.dtype == torch.uint8 and flat.numel() == 3 * cfg.layer_bytes
    for layer, block in enumerate(blocks):
        view = tr.unpack_layer(flat, cfg, layer)
        assert torch.equal(view, block) and tr.digest(view) == tr.digest(block)
        assert view.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()


@pytest.mark.parametrize(
    ("flat", "layer", "match"),
    [
        (torch.zeros(10, dtype=torch.float32), 0, "1-D uint8"),
        (torch.zeros(10, dtype=torch.uint8), 0, "has 10 bytes, the config needs"),
        (None, 2, r"layer must be an int in \[0, 2\)"),
        (None, -1, r"layer must be an int in \[0, 2\)"),
    ],
)
def test_unpack_layer_errors(flat, layer, match):
    cfg = tr.KVConfig(layers=2, heads=1, head_dim=2, seq=2)
    flat = torch.zeros(2 * cfg.layer_bytes, dtype=torch.uint8) if flat is None else flat
    with pytest.raises(ValueError, match=match):
        tr.unpack_layer(flat, cfg, layer)


def test_pack_layer_rejects_non_contiguous():
    with pytest.raises(ValueError, match="must be contiguous"):
        tr.pack_layer(torch.zeros(4, 4).t())


def test_digest_detects_one_flipped_bit_and_rejects_other_devices():
    x = torch.arange(64, dtype=torch.float32)
    y = x.clone()
    y.view(torch.int32)[5] ^= 1
    assert tr.digest(x) == tr.digest(x.clone()) != tr.digest(y)
    assert len(tr.digest(x)) == 16
    with pytest.raises(ValueError, match="expected a CPU tensor, got one on meta"):
        tr.digest(torch.zeros(2, device="meta"))


# ---------------------------------------------------------------- a real NIXL pair in one process


def _pair_both(store: dist.Store, timeout: float = 20.0):
    made: dict[int, object] = {}
    errors: list[BaseException] = []

    def connect(rank: int) -> None:
        try:
            made[rank] = tr.pair(1 - rank, rank=rank, store=store, timeout=timeout, agent_name=f"test-{rank}")
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=connect, args=(r,)) for r in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=timeout + 5)
    if errors:
        raise errors[0]
    return made[0], made[1]


@needs_nixl
def test_pair_publish_fetch_write_read_kv_block():
    store = dist.HashStore()
    t0, t1 = _pair_both(store)
    try:
        assert t0.connected() and t1.connected()
        cfg = tr.KVConfig(layers=2, heads=2, head_dim=4, seq=8)
        blocks = tr.prefill(cfg, tr.make_weights(cfg, 0))
        mems = [t0.register_memory(tr.pack_layer(b)) for b in blocks]
        for i, m in enumerate(mems):
            tr.publish(store, f"kv{i}", m)
        flat = torch.zeros(2 * cfg.layer_bytes, dtype=torch.uint8)
        flat_mem = t1.register_memory(flat)
        for i, (off, length) in enumerate(tr.layer_slices(cfg)):
            assert t1.read(flat_mem.to_mutable_view(off, length), tr.fetch(store, f"kv{i}", timeout=5)) == 0
        assert all(tr.digest(tr.unpack_layer(flat, cfg, i)) == tr.digest(b) for i, b in enumerate(blocks))
        # a write goes the other way: bytes of layer 1 of `flat` land at the start of block 0
        t1.write(flat_mem.to_view(*tr.layer_slices(cfg)[1]), tr.fetch(store, "kv0", timeout=5))
        assert torch.equal(blocks[0], blocks[1])
    finally:
        t0.close(timeout=10)
        t1.close(timeout=10)


@needs_nixl
def test_pair_times_out_without_a_peer():
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="peer rank 1 did not publish its connection bytes within 0.5 s"):
        tr.pair(1, rank=0, store=dist.HashStore(), timeout=0.5)
    assert time.monotonic() - t0 < 10
