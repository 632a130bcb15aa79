"""Chapter 4: can an older torch read a checkpoint that torch 2.15 wrote? Write with one torch, read with another.

    python dcp_cross_version.py write CKPT_DIR                 # with torch 2.15: two checkpoints under CKPT_DIR
    python dcp_cross_version.py read CKPT_DIR --out result.json  # with the torch you want to test (2.14.1, ...)

`write` saves the same small state dict twice with `torch.distributed.checkpoint` (one process): `as-written`, as
2.15 writes it (`TensorProperties` pickled with 6 elements, the last being the new strides), and `stripped`, the
same checkpoint after `pt215.fsdp.strip_stride_metadata` re-pickled its `.metadata` in the 5-element layout of
earlier releases. `read` loads each into fresh tensors with the running torch and records, per checkpoint,
whether the load succeeded and the values match, or the exception it raised. `read` needs only torch.
"""

from __future__ import annotations

import argparse
import json
import platform
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

NAMES = ("as-written", "stripped")


def state() -> dict[str, torch.Tensor]:
    """The state dict both sides agree on: a transposed (non-contiguous) matrix and a vector."""
    return {"w": torch.arange(12.0).reshape(3, 4).t(), "b": torch.ones(4)}


def write(root: Path) -> dict[str, object]:
    from pt215.fsdp import metadata_state_lengths, strip_stride_metadata

    out: dict[str, object] = {"torch": torch.__version__}
    for name in NAMES:
        path = root / name
        path.mkdir(parents=True, exist_ok=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
            dcp.save(state(), checkpoint_id=str(path))
        if name == "stripped":
            strip_stride_metadata(str(path))
        out[name] = {"state_lengths": sorted(set(metadata_state_lengths(str(path))))}
    return out


def read(root: Path) -> dict[str, object]:
    out: dict[str, object] = {"torch": torch.__version__, "python": platform.python_version()}
    for name in NAMES:
        dest = {"w": torch.zeros(4, 3), "b": torch.zeros(4)}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                dcp.load(dest, checkpoint_id=str(root / name))
            ok = all(torch.equal(dest[k], v) for k, v in state().items())
            out[name] = {"loaded": True, "values_equal": ok}
        except (Exception, dcp.api.CheckpointException) as exc:  # noqa: BLE001 - the failure is the result
            first = str(exc).strip().splitlines()
            error = f"{type(exc).__name__}: {first[-1] if first else ''}".replace(str(root), "CKPT_DIR")
            out[name] = {"loaded": False, "error": error[:300]}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["write", "read"])
    ap.add_argument("ckpt_dir", type=Path, help="folder holding the two checkpoints")
    ap.add_argument("--out", type=Path, help="read: write the result as JSON here (default: print only)")
    a = ap.parse_args(argv)
    if a.mode == "write":
        if a.ckpt_dir.exists() and any(a.ckpt_dir.iterdir()):
            ap.error(f"ckpt_dir must be empty or new for write, got {a.ckpt_dir} with files in it")
        result = write(a.ckpt_dir)
    else:
        if not all((a.ckpt_dir / n).is_dir() for n in NAMES):
            ap.error(f"ckpt_dir must hold {' and '.join(NAMES)} (run `write` first), got {a.ckpt_dir}")
        result = read(a.ckpt_dir)
    text = json.dumps(result, indent=1)
    print(text)
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
