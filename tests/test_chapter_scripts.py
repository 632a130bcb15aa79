"""Every chapter script is a standalone program with `main(argv=None)`, and each CPU one runs somewhere in the suite.

A script is imported without side effects (everything happens in `main`). A script a notebook launches on CPU
runs there, at full size, when nbval executes the notebook; it is not launched a second time here. Every other
CPU script runs small here: a single-rank one in this process (its `main` imported and called, as a reader's
test would), a multi-rank one as torchrun starts it (`pt215.launch.run`), and must finish within its timeout.
Scripts that need a GPU are listed with the reason instead, and run in `python -m pt215.verify` where the
hardware exists.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pt215.book_files import chapter_script
from pt215.launch import run
from pt215.verify import boundary

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p for p in ROOT.glob("chapters/*/*.py") if p.name != "conftest.py")

# script (relative to chapters/): (ranks, small arguments, timeout in seconds) for the scripts no notebook
# launches on CPU; ranks 1 runs in this process
SMALL: dict[str, tuple[int, list[str], int]] = {
    "01-collectives-nccl2/resolve_backend.py": (1, [], 60),
    "01-collectives-nccl2/eager_init.py": (2, ["--lazy"], 60),  # 1.2 launches it on nccl only
    "04-fsdp2-precision/dcp_cross_version.py": (1, ["write", "ckpt"], 60),
    "05-nvfp4-decoding/nvfp4_quality_and_decode.py": (
        1, ["--rows", "64", "--windows", "2", "--layers", "1", "--iters", "2", "--bandwidth-mib", "8"], 120),
    "05-nvfp4-decoding/train_lm.py": (
        1, ["--steps", "3", "--batch", "2", "--seq-len", "32", "--eval-bytes", "2049", "--out", "lm.pt"], 120),
    "06-fp8-mps/fp8_accuracy_and_speed.py": (1, ["--small"], 120),
}


def _launched_on_cpu() -> dict[str, str]:
    """script (relative to chapters/) -> the notebook that launches it on CPU (no NCCL backend argument)."""
    out: dict[str, str] = {}
    for cmd in boundary.commands(ROOT):
        args = list(cmd.args)
        backend = args[args.index("--backend") + 1] if "--backend" in args[:-1] else "gloo"
        if "nccl" not in backend:
            script = (Path(cmd.notebook).parent / cmd.script).relative_to("chapters").as_posix()
            out.setdefault(script, cmd.notebook)
    return out


LAUNCHED = _launched_on_cpu()

# script: why it does not run here (it needs hardware this machine lacks, or it is meant to fail)
NOT_HERE = {
    "00-before-you-start/fail.py": "fails on purpose (0.1 shows the error a failing rank raises)",
    "00-before-you-start/hang.py": "hangs on purpose (0.1 shows the launcher's timeout)",
    "04-fsdp2-precision/fsdp_disagree.py": "fails on purpose (4.2's troubleshooting: ranks that disagree about the "
                                           "precision override abort)",
    "02-flight-recorder/debug_server.py": "waits through a straggler's stall and the debug server's dump rounds "
                                          "(about 20 s on 3 ranks); notebook 2.5 runs it",
    "02-flight-recorder/gloo_no_autodump.py": "times out on purpose (a 2 s gloo timeout, then waits for a dump "
                                              "torch does not write); notebook 2.4 runs it",
    "01-collectives-nccl2/time_estimate.py": "needs >= 2 CUDA GPUs on NCCL (dist._time_estimator, CUDA events)",
    "01-collectives-nccl2/window_put.py": "needs >= 2 CUDA GPUs and NCCL >= 2.29 (an NCCL2 window)",
    "01-collectives-nccl2/blocking_wait.py": "needs a CUDA GPU and NCCL (NCCL2's blocking wait)",
}


def _rel(path: Path) -> str:
    return path.relative_to(ROOT / "chapters").as_posix()


def test_every_script_runs_in_a_notebook_or_small_or_says_why_not():
    names = {_rel(p) for p in SCRIPTS}
    covered = set(LAUNCHED) - set(NOT_HERE)
    assert not set(SMALL) & set(NOT_HERE), "a script is listed both as run and as not run"
    assert not set(SMALL) & covered, f"launched by a notebook already, run small again: {sorted(set(SMALL) & covered)}"
    assert names == set(SMALL) | set(NOT_HERE) | covered, (
        f"unlisted: {sorted(names - set(SMALL) - set(NOT_HERE) - covered)}; "
        f"listed but absent: {sorted((set(SMALL) | set(NOT_HERE)) - names)}")
    notebooks = {ROOT / nb.replace(".md", ".ipynb") for nb in LAUNCHED.values()}
    assert all(nb.is_file() for nb in notebooks), "a launching notebook has no stored .ipynb that nbval runs"


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


@pytest.fixture
def in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A clean stage for a script's `main` in this process: its own folder, environment, thread count and
    no process group left behind."""
    import torch
    import torch.distributed as dist

    monkeypatch.chdir(tmp_path)
    env, threads = dict(os.environ), torch.get_num_threads()
    yield tmp_path
    if dist.is_initialized():
        dist.destroy_process_group()
    os.environ.clear()
    os.environ.update(env)
    torch.set_num_threads(threads)


def _main(path: Path):
    spec = importlib.util.spec_from_file_location(f"chapter_script_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.mark.parametrize("name", sorted(n for n, (ranks, _, _) in SMALL.items() if ranks == 1))
def test_single_rank_script_runs_small_in_process(name: str, in_process: Path):
    _, args, _ = SMALL[name]
    assert _main(ROOT / "chapters" / name)(list(args)) in (0, None)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(n for n, (ranks, _, _) in SMALL.items() if ranks > 1))
def test_multi_rank_script_runs_small(name: str, tmp_path: Path):
    nproc, args, timeout = SMALL[name]
    res = run(ROOT / "chapters" / name, nproc, args=args, timeout=timeout, cwd=tmp_path, show=False)
    assert res.returncode == 0


# Scripts that never tear a healthy group down, and why.
NO_SHUTDOWN = {
    "resolve_backend.py": "one process on a HashStore per backend name: nothing to synchronise",
    "gloo_no_autodump.py": "the group is broken on purpose; it leaves with os._exit",
}


def test_every_multi_rank_script_ends_through_the_clean_shutdown():
    """`pt215.launch.shutdown()` ends every healthy group a chapter script joins."""
    for path in sorted(ROOT.glob("chapters/*/*.py")):
        text = path.read_text(encoding="utf-8")
        if "init_process_group" not in text and "init_rank(" not in text or path.name in NO_SHUTDOWN:
            continue
        assert "shutdown()" in text, f"{path.relative_to(ROOT)} does not end with shutdown()"


def test_stress_script_knows_only_real_scripts():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import stress_launch
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    for name in stress_launch.SCRIPTS:
        assert chapter_script(name).is_file()
