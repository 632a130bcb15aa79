"""Chapter 6's FP8 measurements in one run: accuracy against bf16, MoE step time, decode matmul time.

    .venv/bin/python chapters/06-fp8-mps/fp8_accuracy_and_speed.py            # CPU, one thread
    .venv/bin/python chapters/06-fp8-mps/fp8_accuracy_and_speed.py --device mps
    .venv/bin/python chapters/06-fp8-mps/fp8_accuracy_and_speed.py --small    # a quick check of the script

Three measurements, printed as numbered sections:

1. accuracy
    FP8 (e4m3) vs bf16 per scaling on the chapter-5 dense model: mean relative error of the GEMM outputs over
    its 29 GEMMs (real activations on held-out text) and the W8A8 model's perplexity. Deterministic.
2. MoE step time
    grouped_mm vs a per-expert loop (bf16) and the FP8 loop: time of one MoE feed-forward step (8 experts,
    top-2, batch 4).
3. decode matmul time
    FP8 scaled_mm vs bf16 matmul at decode shapes M = 1, 2, 4, each variant cycling through distinct copies
    of its weight so that the timing reads memory, not a cache.

Timings are medians of interleaved repetitions (`pt215.timing.interleaved_medians`); on a GPU or a Mac each
sample is 20 back-to-back calls between two device synchronizations, on CPU one call and one thread. `--small` runs every section on fewer tokens and smaller shapes,
to check the script, not to quote.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from collections.abc import Sequence

import torch

from pt215 import fp8, w8a8
from pt215 import model as lm
from pt215.moe import SeededMoE
from pt215.mps_kernels import ROTATE_BYTES, copies_for
from pt215.timing import interleaved_medians


def calls_per_sample(device: str) -> int:
    """Back-to-back calls per timed sample: a device sync costs about as much as a small decode op."""
    return 1 if device == "cpu" else 20


def accuracy(windows: int = 8) -> None:
    """Section 1: FP8 vs bf16 on the chapter-5 dense model, over `windows` held-out windows of 256 bytes."""
    dense = lm.load_pretrained("dense")
    heldout = lm.load_corpus("heldout")
    acts: dict[str, torch.Tensor] = {}
    hooks = [m.register_forward_pre_hook(lambda mod, a, n=n: acts.__setitem__(n, a[0].reshape(-1, a[0].shape[-1])))
             for n, m in dense.named_modules() if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        dense(heldout[:512].view(4, 128))
    for h in hooks:
        h.remove()
    tokens = heldout[: windows * 256 + 1]
    base = lm.perplexity(dense, tokens, seq_len=256, batch=8)
    print(f"1. accuracy, chapter-5 dense model (e4m3; bf16-stored weights computed in fp32 = reference); "
          f"perplexity reference {base:.4f}")
    for sc in ("tensorwise", "rowwise"):
        errs_w, errs_xw = [], []
        for name, w in lm.gemm_weights(dense):
            x = acts[name.rsplit(".", 1)[0]]
            q = fp8.quantize(w, scaling=sc)
            errs_w.append(fp8.rel_error(w, q.dequantize()))
            errs_xw.append(fp8.rel_error(x @ w.t(), fp8.scaled_matmul(x, q, out_dtype=torch.float32)))
        q_model = w8a8.fp8_model(dense, scaling=sc)
        ppl = lm.perplexity(q_model, tokens, seq_len=256, batch=8)
        agree = lm.next_token_agreement(q_model, dense, tokens, seq_len=256, batch=8)
        print(f"   {sc:<10} weight rel.err {statistics.mean(errs_w):.4f} | GEMM output rel.err mean "
              f"{statistics.mean(errs_xw):.4f} max {max(errs_xw):.4f} over {len(errs_xw)} GEMMs | W8A8 perplexity "
              f"{ppl:.4f} ({(ppl / base - 1) * 100:+.2f}%) | next-token agreement {agree:.4f}")


def grouped_vs_loop(device: str, reps: int, hidden: int = 512, inter: int = 1024) -> None:
    """Section 2: one MoE feed-forward step (8 experts, top-2, batch 4), bf16 grouped_mm vs loops."""
    layer = SeededMoE(hidden, inter, 8, 2, seed=0).to(device)
    layer.to_fp8()
    x = torch.randn(4, hidden, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16).to(device)
    with torch.no_grad():
        s = interleaved_medians({impl: (lambda impl=impl: layer(x, impl)) for impl in ("grouped", "loop", "fp8")},
                                iters=reps, warmup=1, device=device, calls=calls_per_sample(device))
    t = {name: sec * 1e3 for name, sec in s.items()}  # ms
    print(f"2. MoE FFN step on {device}, 8 experts top-2, batch 4, hidden {hidden}, expert hidden {inter}, "
          f"median of {reps}:")
    print(f"   bf16 grouped_mm {t['grouped']:.3f} ms | bf16 loop {t['loop']:.3f} ms "
          f"(loop/grouped {t['loop'] / t['grouped']:.2f}x) | FP8 loop {t['fp8']:.3f} ms "
          f"(FP8/grouped {t['fp8'] / t['grouped']:.1f}x)")


def decode_ratio(device: str, reps: int, sizes: Sequence[int] = (1024, 4096), rotate_bytes: int = ROTATE_BYTES) -> None:
    """Section 3: FP8 scaled_mm vs bf16 matmul at decode shapes M = 1, 2, 4, for K = N in `sizes`.

    Each variant cycles through distinct copies of its weight (`pt215.mps_kernels.copies_for`, `rotate_bytes`
    of bf16 before one is read again): one weight timed over and over is served from a cache, not memory.
    """
    print(f"3. decode matmul on {device}, FP8 scaled_mm (incl. activation quantization) vs bf16, median of {reps}, "
          "weights rotated:")
    for k in sizes:
        g = torch.Generator().manual_seed(2)
        w16s = [(torch.randn(k, k, generator=g) / 32).to(torch.bfloat16) for _ in range(copies_for(2 * k * k,
                                                                                                 rotate_bytes))]
        qs = {sc: [fp8.quantize(w.float(), scaling=sc) for w in w16s] for sc in ("tensorwise", "rowwise")}
        w16s = [w.to(device) for w in w16s]
        qs = {sc: [fp8.FP8Tensor(q.data.to(device), q.scale.to(device), sc) for q in ql] for sc, ql in qs.items()}
        for m in (1, 2, 4):
            x = torch.randn(m, k).to(torch.bfloat16).to(device)
            s = interleaved_medians({"bf16": _cycling(lambda w, x=x: x @ w.t(), w16s),
                                     "tensorwise": _cycling(lambda q, x=x: fp8.scaled_matmul(x, q), qs["tensorwise"]),
                                     "rowwise": _cycling(lambda q, x=x: fp8.scaled_matmul(x, q), qs["rowwise"])},
                                    iters=reps, warmup=1, device=device, calls=calls_per_sample(device))
            t = {name: sec * 1e3 for name, sec in s.items()}  # ms
            print(f"   K=N={k:<5} M={m}  bf16 {t['bf16']:8.3f} ms | FP8 tensorwise {t['tensorwise']:8.3f} ms "
                  f"({t['tensorwise'] / t['bf16']:5.1f}x) | FP8 rowwise {t['rowwise']:8.3f} ms "
                  f"({t['rowwise'] / t['bf16']:5.1f}x)")


def _cycling(fn, items):
    """fn(next item) on each call: every call reads a weight the previous calls did not."""
    nxt = itertools.cycle(items).__next__
    return lambda: fn(nxt())


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "mps"])
    p.add_argument("--reps", type=int, default=11)
    p.add_argument("--small", action="store_true", help="fewer tokens, smaller shapes, 3 repetitions (a quick check)")
    a = p.parse_args(argv)
    if a.reps < 1:
        p.error(f"--reps must be >= 1, got {a.reps}")
    if a.device == "cpu":
        torch.set_num_threads(1)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, device {a.device}" + (", 1 thread" if a.device == "cpu" else ""))
    if a.small:
        accuracy(windows=1)
        grouped_vs_loop(a.device, 3, hidden=128, inter=256)
        decode_ratio(a.device, 3, sizes=(256,), rotate_bytes=2**20)
    else:
        accuracy()
        grouped_vs_loop(a.device, a.reps)
        decode_ratio(a.device, a.reps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
