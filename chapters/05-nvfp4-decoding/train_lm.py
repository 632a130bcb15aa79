"""Train the chapter-5 byte-level LMs whose weights ship in data/05-nvfp4-decoding/.

Reproduce (one CPU thread, seed 0; about 8-15 minutes per model on a busy shared 2-core VM):

    .venv/bin/python chapters/05-nvfp4-decoding/train_lm.py --variant dense --steps 500 --seed 0
    .venv/bin/python chapters/05-nvfp4-decoding/train_lm.py --variant moe   --steps 500 --seed 0

A quick run that checks the whole loop without touching the shipped weights (seconds):

    .venv/bin/python chapters/05-nvfp4-decoding/train_lm.py --steps 3 --batch 2 --seq-len 32 \
        --eval-bytes 2049 --out /tmp/lm.pt

Corpus: data/05-nvfp4-decoding/corpus.txt.gz = Python 3.11.7's pydoc_data.topics (language-reference help
topics, PSF licence), concatenated in sorted-key order; first 90% train, last 10% held out.
Regenerate it with --make-corpus (only identical on Python 3.11.7).
The same seed on the same torch build and thread count gives the same weights; other CPUs may differ in
the last bits (float summation order), which is why the weights themselves are shipped.
"""

from __future__ import annotations

import argparse
import gzip
import math
import sys
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from pt215.model import DATA_DIR, PRETRAINED, ModelConfig, build_model, load_corpus, perplexity, save_checkpoint
from pt215.timing import Stopwatch

VARIANTS = ("dense", "moe")


def make_config(variant: str) -> ModelConfig:
    """The shipped models' configurations: the default dense LM, or 4 experts with top-2 routing."""
    if variant == "moe":
        return ModelConfig(moe_experts=4, moe_top_k=2, moe_ffn_hidden=128)
    return ModelConfig()


def make_corpus() -> None:
    import pydoc_data.topics as topics

    text = "".join(topics.topics[k] for k in sorted(topics.topics))
    (DATA_DIR / "corpus.txt.gz").write_bytes(gzip.compress(text.encode("utf-8"), mtime=0))
    print(f"wrote corpus: {len(text.encode())} bytes (Python {sys.version.split()[0]})")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", choices=VARIANTS, default="dense")
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-bytes", type=int, default=None,
                    help="evaluate perplexity on the first N held-out bytes (default: all of them)")
    ap.add_argument("--out", default=None, help="checkpoint path (default: the shipped file)")
    ap.add_argument("--make-corpus", action="store_true")
    args = ap.parse_args(argv)
    for name in ("steps", "batch", "seq_len"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be a positive int, got {getattr(args, name)}")
    if args.make_corpus:
        make_corpus()
        return 0
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    cfg = make_config(args.variant)
    model = build_model(cfg)
    train, held = load_corpus("train"), load_corpus("heldout")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    g = torch.Generator().manual_seed(args.seed)
    warm = 50
    losses = []
    clock = Stopwatch()  # running: each read gives the seconds since the start
    for step in range(args.steps):
        lr = args.lr * min(1.0, (step + 1) / warm) * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for group in opt.param_groups:
            group["lr"] = lr
        idx = torch.randint(0, len(train) - args.seq_len - 1, (args.batch,), generator=g)
        x = torch.stack([train[i:i + args.seq_len] for i in idx.tolist()])
        y = torch.stack([train[i + 1:i + args.seq_len + 1] for i in idx.tolist()])
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), y.reshape(-1))
        total = loss + 0.01 * model.aux_loss()
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step:4d} loss {loss.item():.3f} lr {lr:.2e} {clock.seconds:.0f}s", flush=True)
    model.eval()
    ppl = perplexity(model, held if args.eval_bytes is None else held[: args.eval_bytes], seq_len=256)
    print(f"held-out perplexity per byte (fp32 weights): {ppl:.3f}; params {model.num_params()}")
    out = args.out or DATA_DIR / PRETRAINED[args.variant]
    meta = {
        "command": f"python chapters/05-nvfp4-decoding/train_lm.py --variant {args.variant} --steps {args.steps} "
                   f"--seed {args.seed}",
        "seed": args.seed, "steps": args.steps, "batch": args.batch, "seq_len": args.seq_len, "lr": args.lr,
        "torch": str(torch.__version__), "final_train_loss": sum(losses[-50:]) / len(losses[-50:]),
        "heldout_ppl_fp32": ppl, "train_seconds": clock.seconds,
    }
    save_checkpoint(model, out, meta=meta)
    print(f"saved {args.variant} checkpoint")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
