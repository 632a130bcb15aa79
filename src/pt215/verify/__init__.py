"""The book's verifier: every hardware-gated path, checked where the hardware is and to its boundary where it is not.

Not a reader's helper: `python -m pt215.verify` runs it (chapters 0-6, 8, 9 list their paths; data/hardware-runs/
holds the records). Importing this package loads no torch, so the website can read the catalogue and the records.

- `paths`: the catalogue of gated paths (`GatedPath`, `PATHS`; torch-free).
- `checks`: every path's check, real and fake, named after its path's id (`ch5.fake-nvfp4` -> `ch5_fake_nvfp4`).
- `runner`: runs the checks this machine supports, skips the rest with the reason, writes the record
  (`python -m pt215.verify`).
- `record`: the record's schema (`RunRecord`, written by the runner, read by the website; torch-free).
- `boundary`: every command a notebook cell launches, run on CPU up to its first hardware call
  (`python -m pt215.verify.boundary`, also `python -m pt215.boundary`).
- `fake_cuda`: the fake-CUDA mechanism (FakeTensors on `cuda`, a simulated GPU's answers; no kernel runs).
"""
