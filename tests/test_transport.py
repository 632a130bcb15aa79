"""Tests for pt215.transport (chapter 3: one-sided transfers with NIXL)."""

from __future__ import annotations

import subprocess
import sys
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


def test_pair_rejects_a_bad_op_timeout():
    with pytest.raises(ValueError, match="op_timeout must be a positive"):
        tr.pair(1, rank=0, store=dist.HashStore(), timeout=1, op_timeout=0)


def test_wait_key_keeps_the_stores_error_which_names_the_key_on_a_tcpstore():
    from datetime import timedelta

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    with pytest.raises(TimeoutError, match="'transport/x' did not appear") as info:
        tr.wait_key(store, "transport/x", timeout=0.2)
    assert isinstance(info.value.__cause__, dist.DistStoreError)
    assert "wait timeout after 200ms, keys: /transport/x" in str(info.value.__cause__)


# ---------------------------------------------------------------- what carried the bytes, what it cost the peer

UCX_REPORT = """\
[1796166537.966476] [vm:3723 :0]   +--------+-------------+-----------------------------------+
[1796166537.966476] [vm:3723 :0]   | torch-ecf6f2413b2f45acbe49bbea1 intra-node cfg#1         |
[1796166537.966476] [vm:3723 :0]   | remote memory write by ucp_put* from host memory to host |
[1796166537.966476] [vm:3723 :0]   +--------+-------------+-----------------------------------+
[1796166537.966476] [vm:3723 :0]   | Range  | Description |              Config               |
[1796166537.966476] [vm:3723 :0]   +--------+-------------+-----------------------------------+
[1796166537.966476] [vm:3723 :0]   | 0..inf | zero-copy   | cma/memory                        |
[1796166537.966476] [vm:3723 :0]   +--------+-------------+-----------------------------------+
[1796166537.967657] [vm:3723 :0]   | torch-ecf6f2413b2f45acbe49bbea1 intra-node cfg#1 |
[1796166537.967657] [vm:3723 :0]   | active message by ucp_am_send* from host memory  |
[1796166537.967657] [vm:3723 :0]   +------------+--------------------+----------------+
[1796166537.967657] [vm:3723 :0]   |          0 | short              | tcp/lo         |
[1796166537.967657] [vm:3723 :0]   |   1..16515 | zero-copy          | tcp/lo         |
| torch-x self cfg#0 |
| remote memory read by ucp_get*(multi) into host memory from host |
| 0..inf | zero-copy   | 52% on tcp/lo and 48% on tcp/eth0 |
| 0..inf | zero-copy   | 52% on tcp/lo and 48% on tcp/eth0 |
a line of the script's own
"""


def test_ucx_protocols_reads_the_one_sided_tables_and_nothing_else():
    found = tr.ucx_protocols(UCX_REPORT.splitlines())
    assert found == {
        "remote memory write by ucp_put* from host memory to host": [("0..inf", "zero-copy", "cma/memory")],
        "remote memory read by ucp_get*(multi) into host memory from host": [
            ("0..inf", "zero-copy", "52% on tcp/lo and 48% on tcp/eth0")],
    }
    assert list(tr.ucx_protocols(UCX_REPORT.splitlines(), operations="active message")) == [
        "active message by ucp_am_send* from host memory"]
    assert tr.ucx_protocols(["nothing here"]) == {}
    with pytest.raises(ValueError, match="operations must be a non-empty string"):
        tr.ucx_protocols([], operations="")


_TCP_COUNT = """
import socket, time
from pt215 import transport as tr

server = socket.create_server(("127.0.0.1", 0))
client = socket.create_connection(server.getsockname())
peer, _ = server.accept()
local_a, local_b = socket.socketpair()                         # a Unix socket: not TCP, not counted
before = tr.tcp_socket_bytes()
local_a.sendall(b"u" * 4096)
local_b.recv(4096)
unix = tr.tcp_socket_bytes() - before
client.sendall(b"x" * 2**20)
got = 0
while got < 2**20:
    got += len(peer.recv(1 << 16))
deadline = time.monotonic() + 5                                # the sender's count waits for the ACKs
while tr.tcp_socket_bytes() - before < 2 * 2**20 and time.monotonic() < deadline:
    time.sleep(0.01)
print(unix, tr.tcp_socket_bytes() - before)
"""


@pytest.mark.skipif(tr.tcp_socket_bytes() is None, reason="needs Linux's /proc/self/fd and TCP_INFO")
def test_tcp_socket_bytes_counts_this_process_tcp_payload_and_nothing_else():
    # In a fresh interpreter: this test process may hold other tests' sockets (a store, a worker's pipe), and the
    # count is the whole process's by design, so only there are the test's own sockets all there is.
    out = subprocess.run([sys.executable, "-c", _TCP_COUNT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    unix, tcp = map(int, out.stdout.split())
    assert unix == 0                                           # the Unix socket's 4 KiB are not counted
    assert tcp == 2 * 2**20                                    # acked by the sender + received by the peer


@pytest.mark.skipif(not tr.thread_times(), reason="needs Linux's per-thread scheduler statistics")
def test_thread_activity_tells_a_thread_that_never_sleeps_from_one_that_sleeps():
    from pt215.timing import Stopwatch

    stop = threading.Event()
    ids: dict[str, int] = {}

    def spin() -> None:
        ids["spin"] = threading.get_native_id()
        while not stop.is_set():
            pass

    def nap() -> None:
        ids["nap"] = threading.get_native_id()
        stop.wait()

    threads = [threading.Thread(target=spin), threading.Thread(target=nap)]
    for th in threads:
        th.start()
    while len(ids) < 2:
        time.sleep(0.01)
    before, clock = tr.thread_times(), Stopwatch()
    time.sleep(0.4)
    activity = tr.thread_activity(before, tr.thread_times(), clock.seconds)
    stop.set()
    for th in threads:
        th.join()
    spin, nap = activity[ids["spin"]], activity[ids["nap"]]
    # About 1 on a quiet machine. On a loaded virtual machine the two counters can miss part of a window (a CI run
    # read 0.37 for this thread: on a CPU 0.36, waiting 0.007), so the test asks what holds under any load: the
    # spinner wanted a CPU for a good share of the window, many times what the sleeper did.
    assert spin.runnable > 0.2 and spin.runnable > 5 * nap.runnable
    assert nap.runnable < 0.1 and nap.on_cpu < 0.05
    with pytest.raises(ValueError, match="seconds must be a positive"):
        tr.thread_activity(before, before, 0)
    with pytest.raises(ValueError, match="pid must be a positive int"):
        tr.thread_times(-3)


# ---------------------------------------------------------------- the chapter's pictures


def test_the_pictures_draw_from_timestamps_and_refuse_missing_ones():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    two = {"send": 1.0, "sent": 1.001, "acked": 1.003, "recv": 0.999, "received": 1.002, "ack_sent": 1.0025}
    fig, axes = tr.transfer_timeline(two, {"write": 2.0, "written": 2.0005, "seen": 2.001})
    assert len(axes) == 2 and [t.get_text() for t in axes[0].get_yticklabels()] == ["rank 0 (initiator)",
                                                                                   "rank 1 (owner)"]
    with pytest.raises(ValueError, match=r"missing timestamps \['seen'\]"):
        tr.transfer_timeline(two, {"write": 2.0, "written": 2.0005})
    cfg = tr.KVConfig(layers=8, heads=2, head_dim=4, seq=8)
    fig2, _ = tr.kv_migration_diagram(cfg)
    with pytest.raises(ValueError, match="shown must be a positive int"):
        tr.kv_migration_diagram(cfg, shown=0)
    fig3, _ = tr.kv_timeline([(0.0, 0.1), (0.1, 0.2)], [(0.1, 0.15), (0.2, 0.25)])
    with pytest.raises(ValueError, match="one span per layer on both sides"):
        tr.kv_timeline([(0.0, 0.1)], [])
    for f in (fig, fig2, fig3):
        plt.close(f)


# ---------------------------------------------------------------- what the transport does when a peer cannot answer


def _local_pair(**options):
    from torch.distributed._transport import new_transport

    a, b = new_transport("nixl", "cpu", **options), new_transport("nixl", "cpu", **options)
    a.connect(b.bind())
    b.connect(a.bind())
    return a, b


@needs_nixl
def test_a_transfer_the_owner_cannot_answer_never_completes_and_only_timeouts_end_the_waits():
    """Both endpoints without NIXL's progress thread (so no polling thread outlives the test): the owner makes no
    progress, so the write's bytes land but it never completes; then the owner closes, as a dead peer would."""
    import asyncio
    from datetime import timedelta

    from torch.distributed._transport import wait_all

    a, b = _local_pair(enable_prog_thread=False, timeout=0.3)
    src, dst = torch.ones(256), torch.zeros(256)
    ms, remote = a.register_memory(src), b.register_memory(dst).to_remote_buffer()
    work = a.write(ms.to_view(), remote, async_op=True)
    deadline = time.monotonic() + 5
    while dst[0].item() == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert dst[0].item() == 1.0 and not work.is_completed()        # the bytes landed; the write is not done
    b.close(timeout=1)                                              # the owner goes away
    time.sleep(0.2)
    assert not work.is_completed() and work.exception() is None and not work.is_success()
    assert type(work._error).__name__ == "nixlRemoteDisconnectError"  # kept, never delivered

    def took(fn) -> float:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            fn()
        return time.monotonic() - t0

    assert 0.19 <= took(lambda: work.wait(timedelta(seconds=0.2))) < 3
    assert 0.29 <= took(lambda: work.wait()) < 3                    # timedelta(0): the operation's 0.3 s
    with pytest.raises(AttributeError, match="total_seconds"):
        work.wait(0.2)                                              # Work.wait takes a timedelta
    assert 0.19 <= took(lambda: asyncio.run(asyncio.wait_for(wait_all([work]), 0.2))) < 3  # no deadline of its own
    with pytest.raises(RuntimeError, match="memory has pending transfers"):
        a.unregister_memory(ms)

    def with_block() -> None:
        with a:
            pass

    assert 0.29 <= took(with_block) < 3                             # close() with the transport's 0.3 s
    assert not a.connected() and a._closing and not a._closed and len(a._registrations) == 1
    with pytest.raises(RuntimeError, match="transport is closed"):
        a.register_memory(torch.zeros(4))
    assert 0.09 <= took(lambda: a.close(timeout=0.1)) < 3           # a retried close waits again
    assert len(a._registrations) == 1                               # and still keeps the memory


@needs_nixl
def test_stream_transfers_refuse_only_an_explicit_zero_timeout():
    a, b = _local_pair(enable_prog_thread=False)
    try:
        mem, remote = a.register_memory(torch.ones(4)), b.register_memory(torch.zeros(4)).to_remote_buffer()
        into = a.register_memory(torch.zeros(4))
        with pytest.raises(ValueError, match="stream transfers require a positive timeout"):
            a.write_stream(mem.to_view(), remote, timeout=0)
        with pytest.raises(ValueError, match="stream transfers require a positive timeout"):
            a.read_stream(into.to_mutable_view(), remote, timeout=0)
        for call in (lambda: a.write_stream(mem.to_view(), remote), lambda: a.read_stream(into.to_mutable_view(),
                                                                                        remote, timeout=None)):
            with pytest.raises((RuntimeError, AssertionError)) as info:  # past the check; fails at CUDA here
                call()
            assert "positive timeout" not in str(info.value)
    finally:
        a.close(timeout=5)
        b.close(timeout=5)


@needs_nixl
def test_the_progress_thread_never_sleeps_and_is_not_made_without_enable_prog_thread():
    if not tr.thread_times():
        pytest.skip("needs Linux's per-thread scheduler statistics")
    from pt215.timing import Stopwatch

    made = {}
    for prog in (True, False):
        before = set(tr.thread_times())
        a, b = _local_pair(enable_prog_thread=prog)
        start, clock = tr.thread_times(), Stopwatch()
        time.sleep(0.4)
        activity = tr.thread_activity(start, tr.thread_times(), clock.seconds)
        made[prog] = [act for tid, act in activity.items() if tid not in before and act.runnable > 0.8]
        a.close(timeout=5)
        b.close(timeout=5)
    assert len(made[True]) == 2 and all(act.voluntary <= 5 for act in made[True])  # one per endpoint, polling
    assert made[False] == []
