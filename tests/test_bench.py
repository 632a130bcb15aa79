"""Tests for pt215.bench (chapter 1): the nccl-tests formulas against hand-computed values, argument errors,
and one small 2-rank run through pt215.launch."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pt215 import bench
from pt215.bench import algbw, bus_bandwidth, bus_factor, parse_size, size_sweep

# (op, nbytes, seconds, world_size, expected GB/s), worked out by hand:
#   all_reduce, 1e9 B in 1 s on 4 ranks: algbw 1 GB/s, factor 2*3/4 = 1.5 -> 1.5
#   all_reduce on 8 ranks: factor 2*7/8 = 1.75; 4e9 B in 2 s -> algbw 2 -> 3.5
#   all_gather on 4 ranks: factor 3/4; 8e9 B in 4 s -> algbw 2 -> 1.5
#   reduce_scatter on 2 ranks: factor 1/2; 1e9 B in 0.5 s -> algbw 2 -> 1.0
#   all_to_all on 8 ranks: factor 7/8; 8e9 B in 1 s -> 7.0
#   broadcast / reduce / send_recv: factor 1; 3e9 B in 1.5 s -> 2.0
#   1 rank: all_reduce moves nothing over the bus -> 0.0
HAND = [
    ("all_reduce", 10**9, 1.0, 4, 1.5),
    ("all_reduce", 4 * 10**9, 2.0, 8, 3.5),
    ("all_gather", 8 * 10**9, 4.0, 4, 1.5),
    ("reduce_scatter", 10**9, 0.5, 2, 1.0),
    ("all_to_all", 8 * 10**9, 1.0, 8, 7.0),
    ("broadcast", 3 * 10**9, 1.5, 4, 2.0),
    ("reduce", 3 * 10**9, 1.5, 16, 2.0),
    ("send_recv", 3 * 10**9, 1.5, 2, 2.0),
    ("all_reduce", 10**9, 1.0, 1, 0.0),
    ("all_reduce", 2**20, 1e-4, 2, 2**20 / 1e-4 / 1e9),
]


@pytest.mark.parametrize("op,nbytes,seconds,n,expected", HAND)
def test_bus_bandwidth_hand_values(op, nbytes, seconds, n, expected):
    assert math.isclose(bus_bandwidth(op, nbytes, seconds, n), expected, rel_tol=1e-12)


@pytest.mark.parametrize("op,n,expected", [("all_reduce", 2, 1.0), ("all_reduce", 4, 1.5),
                                            ("all_gather", 4, 0.75), ("all_to_all", 2, 0.5),
                                            ("broadcast", 8, 1.0), ("send_recv", 2, 1.0)])
def test_bus_factor(op, n, expected):
    assert bus_factor(op, n) == expected


def test_algbw_units_are_1e9():
    assert algbw(2 * 10**9, 1.0) == 2.0
    assert algbw(0, 1.0) == 0.0


@pytest.mark.parametrize("kwargs,names", [
    (dict(op="allreduce"), "op must be one of"),
    (dict(op="all-reduce"), "op must be one of"),
    (dict(op=None), "op must be one of"),
    (dict(nbytes=-1), "nbytes must be an int >= 0"),
    (dict(nbytes=1.5), "nbytes must be an int >= 0"),
    (dict(nbytes=True), "nbytes must be an int >= 0"),
    (dict(seconds=0), "seconds must be a finite number > 0"),
    (dict(seconds=-1.0), "seconds must be a finite number > 0"),
    (dict(seconds=float("inf")), "seconds must be a finite number > 0"),
    (dict(seconds=float("nan")), "seconds must be a finite number > 0"),
    (dict(seconds="1"), "seconds must be a finite number > 0"),
    (dict(world_size=0), "world_size must be an int >= 1"),
    (dict(world_size=2.0), "world_size must be an int >= 1"),
])
def test_bus_bandwidth_argument_errors(kwargs, names):
    args = dict(op="all_reduce", nbytes=1024, seconds=1e-3, world_size=2) | kwargs
    with pytest.raises(ValueError, match=names):
        bus_bandwidth(**args)


@pytest.mark.parametrize("text,expected", [("4096", 4096), ("64K", 65536), ("1M", 2**20), ("2g", 2 * 2**30),
                                           ("8MiB", 8 * 2**20), (512, 512)])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "1.5M", "10T", "-4K", 0, "0"])
def test_parse_size_errors(bad):
    with pytest.raises(ValueError, match="size"):
        parse_size(bad)


def test_size_sweep():
    assert size_sweep(1024, 16384, 2) == [1024, 2048, 4096, 8192, 16384]
    assert size_sweep(1024, 10000, 4) == [1024, 4096]
    with pytest.raises(ValueError, match="max_bytes must be >= min_bytes"):
        size_sweep(4096, 1024)
    with pytest.raises(ValueError, match="factor must be an int >= 2"):
        size_sweep(1024, 4096, 1)


def test_sweep_argument_errors():
    with pytest.raises(ValueError, match="op must be one of"):
        bench.sweep("gather", [1024])
    with pytest.raises(ValueError, match="sizes must be a non-empty sequence"):
        bench.sweep("all_reduce", 1024)


def test_time_collective_needs_a_group():
    with pytest.raises(RuntimeError, match="initialized process group"):
        bench.time_collective("all_reduce", 1024)


@pytest.fixture
def one_rank_group():
    """A 1-rank gloo group in this process (what `launch.init_rank` forms without torchrun)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_time_collective_on_one_rank(one_rank_group):
    seconds, used, ok = bench.time_collective("all_gather", 4096, warmup=1, iters=2)
    assert seconds > 0 and used == 4096 and ok
    with pytest.raises(ValueError, match="too small"):
        bench.time_collective("all_reduce", 2)


def test_cli_keeps_a_callers_group(one_rank_group, capsys):
    """With a process group already there, `main` uses it and leaves it standing."""
    import torch.distributed as dist

    assert bench.main(["-b", "4K", "-e", "4K", "-w", "1", "-n", "1", "--copy-bytes", "64K"]) == 0
    assert dist.is_initialized()
    out = capsys.readouterr().out
    assert "payload ceiling = copy / 2" in out and "of the payload ceiling" in out


def test_cli_without_torchrun_forms_and_ends_its_own_group(monkeypatch, capsys):
    import torch.distributed as dist

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    assert bench.main(["--backend", "gloo", "-b", "4K", "-e", "4K", "-w", "1", "-n", "1", "--copy-bytes", "64K"]) == 0
    assert not dist.is_initialized()
    assert "backend gloo, 1 rank(s), cpu" in capsys.readouterr().out


def test_cli_help(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "torchrun --nproc-per-node" in out and "2(n-1)/n" in out


@pytest.mark.slow
def test_two_rank_sweep_through_launch(tmp_path: Path):
    """Every op on 2 gloo ranks: correct results, positive bandwidths, busbw = algbw * factor."""
    from pt215.launch import run

    script = tmp_path / "sweep.py"
    script.write_text("from pt215.bench import main\nraise SystemExit(main())\n")
    res = run(script, nproc=2, timeout=120, show=False, stream=False,
              args=["--op", *bench.OPS, "-b", "4K", "-e", "16K", "-w", "1", "-n", "2", "--copy-bytes", "1M"])
    for rank in (0, 1):
        out = res.results[rank]
        assert out["world_size"] == 2 and out["backend"] == "gloo" and out["copy_GBps"] > 0
        assert out["payload_ceiling_GBps"] == out["copy_GBps"] / 2  # copy_bandwidth counts a copy of n bytes as 2n
        assert len(out["rows"]) == len(bench.OPS) * 2
        for row in out["rows"]:
            assert row["correct"], row
            assert math.isclose(row["busbw"], row["algbw"] * bus_factor(row["op"], 2))
    assert res.results[0]["rows"] == res.results[1]["rows"]  # time is averaged across ranks


def test_link_ceiling_without_nvidia_smi_is_unknown_with_the_reason(monkeypatch):
    """busbw's ceiling comes from `pt215.links`, which asks `nvidia-smi` through `pt215.hardware.nvidia_smi`:
    absent or failing, `link_peak` raises FileNotFoundError and the benchmark reports the ceiling as unknown."""
    import torch

    from pt215 import links

    monkeypatch.setattr(links, "nvidia_smi", lambda args, timeout=30.0: None)
    with pytest.raises(FileNotFoundError, match="pass topo= and pcie_gen="):
        links.link_peak(2, (9, 0), local=2, visible="")
    monkeypatch.setattr(links, "nvidia_smi", lambda args, timeout=30.0: "GPU0 X PIX\nGPU1 PIX X\n" if "topo" in args
                        else "N/A\n")
    with pytest.raises(ValueError, match="pcie_gen="):
        links.link_peak(2, (9, 0), local=2, visible="")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    link = bench._link(2, torch.device("cuda", 0), None)
    assert link is not None and link["kind"] == "unknown" and link["GBps"] is None and "ValueError" in link["how"]
    assert bench._link(2, torch.device("cpu"), None) is None
