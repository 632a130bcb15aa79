"""pt215.mps_kernels: the release's MPS operations build and run (here on CPU), one table for 6.3 and verify."""

from __future__ import annotations

import pytest
import torch

from pt215.mps_kernels import RELEASE_FIGURES, ROTATE_BYTES, copies_for, release_cases

SMALL = {"linear_shapes": ((64, 32), (16, 32)), "rotate_bytes": 64 * 1024, "norm_size": 64}


def test_every_release_case_runs_and_says_how_it_is_sampled():
    cases = release_cases("cpu", torch.float32, **SMALL)
    assert any(k.startswith("F.linear M=1") for k in cases) and "QR 512x512 fp32" in cases
    for name, case in cases.items():
        assert case.iters >= 5 and case.calls >= 1, name
        case.fn()
    assert cases["QR 512x512 fp32"].calls == 1 and len(RELEASE_FIGURES) == 5
    assert cases["F.linear M=1 32->64"].nbytes == 64 * 32 * 4 and cases["softmax, 1 row x 128256"].nbytes is None


def test_a_gemv_case_reads_a_different_weight_on_each_call():
    """One weight timed 20 times in a row measures a cache, not memory: the case cycles through its copies."""
    case = release_cases("cpu", torch.float32, **SMALL)["F.linear M=1 32->64"]
    outs = [case.fn() for _ in range(copies_for(64 * 32 * 4, SMALL["rotate_bytes"]) + 1)]
    assert not torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[-1])  # distinct copies, then around


def test_copies_for_covers_the_rotation_and_never_repeats_back_to_back():
    assert copies_for(32 * 2**20) == 8 and copies_for(112 * 2**20) == 3 and copies_for(ROTATE_BYTES * 4) == 2
    with pytest.raises(ValueError, match="nbytes must be a positive int"):
        copies_for(0)
    with pytest.raises(ValueError, match="linear_shapes must be"):
        release_cases("cpu", linear_shapes=((0, 4),))
