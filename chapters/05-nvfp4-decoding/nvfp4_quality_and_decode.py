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
    (`pt215.model.next_token_agreement`) on 24 windows of 256 bytes, per weight format (FP8 tensorwise and
    rowwise through `pt215.fp8.quantize`, NVFP4; weight-only quantize-dequantize), for the dense and MoE
    models: notebook 2's table. Deterministic.
decode
    Notebook 3's roofline measurement (`pt215.roofline.measure_decode_roofline`, same arguments): read and copy
    bandwidth (copy counted as 2 x bytes, read + write: the book's convention), GEMM throughput, and fp32/bf16
    decode steps at B=1 and B=4, interleaved round-robin on one thread, with the achieved-bandwidth fraction.
    Varies by run; the notebook's stored output is one such run.

The defaults are the chapter's sizes; `--rows`, `--windows`, `--layers`, `--iters` and `--bandwidth-mib` shrink
them for a quick check (tests/test_chapter_scripts.py).
"""

from __future__ import annotations

import argparse
import copy
import logging
from collections.abc import Sequence

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


FORMATS = ("fp8-tensorwise", "fp8-rowwise", "nvfp4")


def roundtrip(fmt: str, w: torch.Tensor) -> torch.Tensor:
    """Weight-only quantize-dequantize of ``w`` in ``fmt`` (notebook 2's ``FMTS``), float32 out."""
    if fmt == "nvfp4":
        return nvfp4.quantize(w).dequantize(torch.float32)
    return nvfp4.fp8_roundtrip(w, fmt.removeprefix("fp8-"))


def quality(windows: int = 24, seq: int = 256) -> None:
    held = M.load_corpus("heldout")[: seq * windows + 1]
    for name in ("dense", "moe"):
        base = M.load_pretrained(name)
        ppl0 = M.perplexity(base, held, seq_len=seq, batch=8)
        print(f"{name:5s} bf16            ppl/byte {ppl0:.3f}  agreement 1.0000")
        for fname in FORMATS:
            q = M.with_weights(base, lambda n, w, fname=fname: roundtrip(fname, w))
            ppl = M.perplexity(q, held, seq_len=seq, batch=8)
            agree = M.next_token_agreement(q, base, held, seq_len=seq, batch=8)
            print(f"{name:5s} {fname:<15} ppl/byte {ppl:.3f}  agreement {agree:.4f}")


def decode(layers: int = 8, iters: int = 15, bandwidth_mib: int = 256) -> None:
    torch.manual_seed(0)
    cfg = M.ModelConfig(d_model=512, n_layers=layers, n_heads=8, n_kv_heads=2, ffn_hidden=1408, max_seq_len=1024)
    model = M.build_model(cfg).eval()
    models = {"fp32": model, "bf16": copy.deepcopy(model).to(torch.bfloat16)}
    run = R.measure_decode_roofline(models, batches=(1, 4), context=64, iters=iters, warmup=3, threads=1,
                                    bandwidth_bytes=bandwidth_mib * 2**20)
    bw = run["read_bw"]
    print(f"bandwidth ({run['threads']} thread, medians of {run['iters']} interleaved rounds): read "
          f"{bw / 1e9:.2f} GB/s, copy {run['copy_bw'] / 1e9:.2f} GB/s (2 x bytes: read + write); GEMM fp32 "
          f"{run['gemm_flops']['fp32'] / 1e9:.1f} / bf16 {run['gemm_flops']['bf16'] / 1e9:.1f} GFLOP/s")
    for (fmt, b), r in run["decode"].items():
        achieved = r["step_bytes"] / r["step_s"]
        print(f"{fmt} decode, {model.num_params() / 1e6:.1f}M-param model, B={b}, context 64: step "
              f"{r['step_s'] * 1e3:.1f} ms = {r['tokens_per_s']:.1f} tok/s; {r['step_bytes'] / 1e6:.1f} MB/step -> "
              f"achieved {achieved / 1e9:.2f} GB/s = {achieved / bw:.0%} of read bandwidth; memory ceiling "
              f"{R.predicted_tokens_per_s(r['step_bytes'], 0.0, b, bw):.1f} tok/s")


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
    p.add_argument("--windows", type=_positive, default=24, help="held-out windows of 256 bytes for quality")
    p.add_argument("--layers", type=_positive, default=8, help="layers of the decode model (8: 22.8M params)")
    p.add_argument("--iters", type=_positive, default=15, help="timed interleaved rounds of the decode roofline")
    p.add_argument("--bandwidth-mib", type=_positive, default=256, help="buffer for the bandwidth measurement")
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
