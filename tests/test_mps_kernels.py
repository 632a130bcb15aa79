"""pt215.mps_kernels: the release's MPS operations build and run (here on CPU), one table for 6.3 and verify."""

from __future__ import annotations

import torch

from pt215.mps_kernels import RELEASE_FIGURES, release_cases


def test_every_release_case_runs_and_says_how_it_is_sampled():
    cases = release_cases("cpu", torch.float32)
    assert any(k.startswith("F.linear M=1") for k in cases) and "QR 512x512 fp32" in cases
    for name, (fn, iters, calls) in cases.items():
        assert iters >= 5 and calls >= 1, name
        fn()
    assert cases["QR 512x512 fp32"][2] == 1 and len(RELEASE_FIGURES) == 5
