"""Every chapter script is a standalone program with `main(argv=None)`, and each CPU one runs small here.

A script is imported without side effects (everything happens in `main`), started as torchrun starts it
(`python -m pt215.launch` semantics through `pt215.launch.run`), and must exit 0 within its timeout. The
small arguments below are the quickest run that still goes through the script's whole `main`; the notebooks
run the full-size versions. Scripts that need a GPU are listed with the reason instead, and run in
`python -m pt215.verify` where the hardware exists.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pt215.launch import run

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p for p in ROOT.glob("chapters/*/*.py") if p.name != "conftest.py")

# script (relative to chapters/): (ranks, small arguments, timeout in seconds)
# ---- chapter 0
CH0 = {
    "00-before-you-start/hello.py": (2, [], 120),
}
# ---- chapter 1
CH1: dict[str, tuple[int, list[str], int]] = {
    "01-collectives-nccl2/collectives.py": (4, [], 120),
    "01-collectives-nccl2/resolve_backend.py": (1, [], 60),
    "01-collectives-nccl2/eager_init.py": (2, ["--lazy"], 60),
    "01-collectives-nccl2/nccl_only.py": (2, [], 60),
    "01-collectives-nccl2/reconfigure.py": (3, [], 90),
    "01-collectives-nccl2/bandwidth.py": (2, ["-b", "4K", "-e", "16K", "-w", "1", "-n", "2", "--copy-bytes", "64K",
                                              "--rounds", "2"], 90),
}
# ---- chapter 2
CH2: dict[str, tuple[int, list[str], int]] = {
    "02-flight-recorder/fr_env_probe.py": (1, ["--root", ".", "--ops", "2"], 120),
    "02-flight-recorder/fr_overhead.py": (2, ["--iters", "10", "--sizes", "16"], 120),
    "02-flight-recorder/hang_lab.py": (3, ["--case", "healthy", "--dump-dir", "dumps"], 120),
}
# ---- chapter 3
CH3: dict[str, tuple[int, list[str], int]] = {
    "03-nixl-transfers/api_tour.py": (2, ["--store", "tcp"], 120),
    "03-nixl-transfers/failures.py": (2, ["--case", "timeout"], 120),
    "03-nixl-transfers/kv_migrate.py": (2, ["--layers", "2", "--heads", "2", "--head-dim", "8", "--seq", "16"], 120),
    "03-nixl-transfers/transfer_sweep.py": (
        2, ["--min-kib", "4", "--max-mib", "1", "--step", "16", "--budget-mib", "1"], 120),
}
# ---- chapter 4
CH4: dict[str, tuple[int, list[str], int]] = {
    "04-fsdp2-precision/fsdp_accum_dcp.py": (2, ["--micro", "2"], 150),
    "04-fsdp2-precision/dcp_cross_version.py": (1, ["write", "ckpt"], 60),
    "04-fsdp2-precision/fsdp_async_pipeline.py": (2, ["--micro", "1"], 150),
    "04-fsdp2-precision/fsdp_cuda_graph.py": (2, ["--device", "cpu", "--micro", "2", "--windows", "1"], 150),
    "04-fsdp2-precision/fsdp_experiment.py": (2, ["--steps", "2"], 150),
    "04-fsdp2-precision/fsdp_override.py": (2, [], 150),
}
# ---- chapter 5
CH5: dict[str, tuple[int, list[str], int]] = {
    "05-nvfp4-decoding/nvfp4_quality_and_decode.py": (
        1, ["--rows", "64", "--windows", "2", "--layers", "1", "--iters", "2", "--bandwidth-mib", "8"], 120),
    "05-nvfp4-decoding/train_lm.py": (
        1, ["--steps", "3", "--batch", "2", "--seq-len", "32", "--eval-bytes", "2049", "--out", "lm.pt"], 120),
}
# ---- chapter 6
CH6: dict[str, tuple[int, list[str], int]] = {
    "06-fp8-mps/fp8_accuracy_and_speed.py": (1, ["--small"], 120),
}
# ---- chapter 7
CH7: dict[str, tuple[int, list[str], int]] = {
    "07-upgrading/reduce_dtype_probe.py": (2, [], 150),
}

# ---- chapter 8
CH8: dict[str, tuple[int, list[str], int]] = {
    "08-pipeline-parallelism/pipeline_memory.py": (
        4, ["--budgets", "1", "--microbatches", "4", "--mb-rows", "2", "--dim", "8", "--steps", "1", "--per-edge"],
        180),
}

SMALL = {**CH0, **CH1, **CH2, **CH3, **CH4, **CH5, **CH6, **CH7, **CH8}

# script: why it does not run here (it needs hardware this machine lacks, or it is meant to fail)
NOT_HERE = {
    "00-before-you-start/fail.py": "fails on purpose (0.1 shows the error a failing rank raises)",
    "00-before-you-start/hang.py": "hangs on purpose (0.1 shows the launcher's timeout)",
    "04-fsdp2-precision/fsdp_disagree.py": "fails on purpose (4.2's troubleshooting: ranks that disagree about the "
                                           "precision override abort)",
    "02-flight-recorder/debug_server.py": "waits through a straggler's stall and the debug server's dump rounds "
                                          "(about 20 s on 3 ranks); notebook 2.5 runs it",
    "02-flight-recorder/gloo_no_autodump.py": "times out on purpose (a 3 s gloo timeout, then waits for a dump "
                                              "torch does not write); notebook 2.4 runs it",
    "01-collectives-nccl2/time_estimate.py": "needs >= 2 CUDA GPUs on NCCL (dist._time_estimator, CUDA events)",
    "01-collectives-nccl2/window_put.py": "needs >= 2 CUDA GPUs and NCCL >= 2.29 (an NCCL2 window)",
}


def _rel(path: Path) -> str:
    return path.relative_to(ROOT / "chapters").as_posix()


def test_every_script_is_either_run_small_or_says_why_not():
    names = {_rel(p) for p in SCRIPTS}
    assert not set(SMALL) & set(NOT_HERE), "a script is listed both as run and as not run"
    assert names == set(SMALL) | set(NOT_HERE), (
        f"unlisted: {sorted(names - set(SMALL) - set(NOT_HERE))}; "
        f"listed but absent: {sorted((set(SMALL) | set(NOT_HERE)) - names)}")


@pytest.mark.parametrize("path", SCRIPTS, ids=_rel)
def test_script_has_main_and_no_import_side_effects(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    mains = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    assert mains, f"{_rel(path)}: no top-level main()"
    args = mains[0].args
    assert [a.arg for a in args.args] == ["argv"] and len(args.defaults) == 1 \
        and isinstance(args.defaults[0], ast.Constant) and args.defaults[0].value is None, \
        f"{_rel(path)}: main must be `def main(argv=None)`"
    allowed = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign, ast.If)
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # docstring
        assert isinstance(node, allowed), f"{_rel(path)}:{node.lineno}: statement runs at import"
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            calls = [n for n in ast.walk(node.value) if isinstance(n, ast.Call)]
            assert not calls, f"{_rel(path)}:{node.lineno}: a module-level call runs at import; move it into main()"
        if isinstance(node, ast.If):
            test = ast.unparse(node.test)
            assert test in ("__name__ == '__main__'", '__name__ == "__main__"'), \
                f"{_rel(path)}:{node.lineno}: only `if __name__ == '__main__':` may run code at module level"
            assert ast.unparse(node.body[-1]) in ("raise SystemExit(main())", "sys.exit(main())"), \
                f"{_rel(path)}:{node.lineno}: the main guard must end with `raise SystemExit(main())`"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SMALL))
def test_script_runs_small(name: str, tmp_path: Path):
    nproc, args, timeout = SMALL[name]
    if name.startswith("03-nixl-transfers/"):
        pytest.importorskip("nixl", reason="chapter 3's scripts need nixl (Linux only)")
    res = run(ROOT / "chapters" / name, nproc, args=args, timeout=timeout, cwd=tmp_path, show=False)
    assert res.returncode == 0
