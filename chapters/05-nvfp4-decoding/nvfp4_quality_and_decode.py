"""Chapter 5's measurements of NVFP4 on CPU, in one run: quantizer speed, model quality, decode speed.

    .venv/bin/python chapters/05-nvfp4-decoding/nvfp4_quality_and_decode.py
    .venv/bin/python chapters/05-nvfp4-decoding/nvfp4_quality_and_decode.py --only decode

Three independent measurements (``--only`` picks one):

quantizer
    Throughput of the reference NVFP4 quantizer (`pt215.nvfp4.quantize`) next to torchao's
    `NVFP4Tensor.to_nvfp4` on the same 1024x4096 float32 input, one thread, median of 5 after one warm-up
    (`pt215.timing.median_seconds`). Varies by run.
quality
    Held-out perplexity per byte (`pt215.model.perplexity`) and next-token agreement with bf16
    (`pt215.model.next_token_agreement`) on four held-out slices of `--windows` windows of 256 bytes, for FP8
    rowwise weight-only, NVFP4 weight-only and NVFP4 W4A4 (`pt215.nvfp4.w4a4`), on the dense and MoE models:
    notebook 5.2's table, each change with its mean and 95% interval over the slices. Deterministic on one CPU.
decode
    Notebook 5.3's measurement (`pt215.roofline.decode_sweep`): a model sized to four times this machine's
    last-level cache (or `--bandwidth-mib` MiB), its cache-resident twin, the read and copy bandwidth over its
    weights, the fp32 GEMM rate, and decode steps at B=1, 4 and 16, interleaved round-robin on all cores; each
    step against its byte floor. Varies by run; the notebook's stored output is one such run.

The defaults are the chapter's sizes; `--rows`, `--windows`, `--layers`, `--iters` and `--bandwidth-mib` shrink
them for a quick check (tests/test_chapter_scripts.py).
"""

from __future__ import annotations

import argparse
import logging
import math
from collections.abc import Callable, Sequence

import torch

from pt215 import model as M
from pt215 import nvfp4
from pt215 import roofline as R
from pt215.timing import median_seconds


def quantizer_throughput(rows: int = 1024) -> None:
    from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale

    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x = torch.randn(rows, 4096, generator=torch.Generator().manual_seed(0))
        g = per_tensor_amax_to_scale(x.abs().amax())
        t_ref = median_seconds(lambda: nvfp4.quantize(x, g), iters=5, warmup=1)
        t_ao = median_seconds(lambda: NVFP4Tensor.to_nvfp4(x, per_tensor_scale=g), iters=5, warmup=1)
    finally:
        torch.set_num_threads(prev)
    print(f"quantizer, {rows}x4096 fp32, 1 thread: pt215 {x.numel() / t_ref / 1e6:.1f} M elem/s, "
          f"torchao {x.numel() / t_ao / 1e6:.1f} M elem/s")


def recipes() -> dict[str, Callable[[torch.nn.Module], torch.nn.Module]]:
    """Notebook 5.2's recipes: each builds the quantized model from the bf16 one."""
    return {"FP8 rowwise (W8A16)": lambda m: M.with_weights(m, lambda n, w: nvfp4.fp8_roundtrip(w, "rowwise")),
            "NVFP4 weight-only (W4A16)": lambda m: M.with_weights(m, lambda n, w: nvfp4.roundtrip(w)),
            "NVFP4 W4A4": nvfp4.w4a4}


STARTS = (0, 45, 90, 135)  # the four held-out slices start at these windows (notebook 5.2)


def _mean_interval(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return mean, 3.182 * sd / math.sqrt(len(values))  # Student's t, 3 degrees of freedom


def quality(windows: int = 4, seq: int = 256) -> None:
    held = M.load_corpus("heldout")
    slices = [held[s * seq:(s + windows) * seq + 1] for s in STARTS]
    prev = torch.get_num_threads()
    torch.set_num_threads(1)  # as notebook 5.2: small models, and threads waiting for each other on a shared machine
    try:
        _quality(slices, seq)
    finally:
        torch.set_num_threads(prev)


def _quality(slices: list[torch.Tensor], seq: int) -> None:
    for name in ("dense", "moe"):
        base = M.load_pretrained(name)
        ppl0 = [M.perplexity(base, sl, seq_len=seq, batch=8) for sl in slices]
        for rname, make in recipes().items():
            q = make(base)
            change = [100 * (M.perplexity(q, sl, seq_len=seq, batch=8) / p - 1) for sl, p in zip(slices, ppl0, strict=True)]
            agree = [M.next_token_agreement(q, base, sl, seq_len=seq, batch=8) for sl in slices]
            mc, hc = _mean_interval(change)
            print(f"{name:5s} {rname:<27} perplexity {mc:+.2f} % [{mc - hc:+.1f}, {mc + hc:+.1f}] over "
                  f"{len(slices)} slices; agreement {sum(agree) / len(agree):.3f}")


def decode(layers: int = 8, iters: int = 5, bandwidth_mib: int | None = None) -> None:
    run = R.decode_sweep("cpu", batches=(1, 4, 16), context=64, iters=iters, warmup=1, n_layers=layers,
                         working_set=None if bandwidth_mib is None else bandwidth_mib * 2**20)
    bw, peak = run["read_bw"], run["gemm_flops"]["fp32"]
    llc = "unknown" if run["llc"] is None else f"{run['llc'] / 2**20:.0f} MiB"
    print(f"last-level cache {llc}; weights {run['working_set'] / 2**20:.0f} MiB; {run['threads']} threads; "
          f"read {bw / 1e9:.2f} GB/s, copy {run['copy_bw'] / 1e9:.2f} GB/s (2 x bytes: read + write), "
          f"fp32 GEMM {peak / 1e9:.1f} GFLOP/s; {sum(run['ops']['model'].values())} aten ops per step")
    for (name, b), r in run["decode"].items():
        print(f"{name:<5} B={b:<3} step {r['step_s'] * 1e3:8.2f} ms = {r['tokens_per_s']:8.2f} tok/s; byte floor "
              f"{r['step_bytes'] / bw * 1e3:8.2f} ms; compute floor {r['step_flops'] / peak * 1e3:7.2f} ms")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=("quantizer", "quality", "decode"), action="append",
                   help="run only this measurement (repeatable); default: all three")
    p.add_argument("--rows", type=_positive, default=1024, help="quantizer input rows (x 4096 columns)")
    p.add_argument("--windows", type=_positive, default=4, help="held-out windows of 256 bytes per slice (4 slices)")
    p.add_argument("--layers", type=_positive, default=8, help="layers of the decode model")
    p.add_argument("--iters", type=_positive, default=5, help="timed interleaved rounds of the decode measurement")
    p.add_argument("--bandwidth-mib", type=_positive, default=None,
                   help="the decode model's weights in MiB (default: four times the last-level cache)")
    a = p.parse_args(argv)
    # torchao logs two deprecation warnings from torch.utils._pytree on import; they are not about NVFP4
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    parts = {"quantizer": lambda: quantizer_throughput(a.rows), "quality": lambda: quality(a.windows),
             "decode": lambda: decode(a.layers, a.iters, a.bandwidth_mib)}
    for name, part in parts.items():
        if a.only is None or name in a.only:
            part()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
