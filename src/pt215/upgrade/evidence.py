"""What the scanner's rules rest on, read from wheels (chapter 7): `python -m pt215.upgrade.evidence`.

    python -m pt215.upgrade.evidence --old-wheel torch-2.14.0-...whl --old-wheel torch-2.13.0-...whl \\
        --nccl-wheel nvidia_nccl_cu12-2.27.3-...whl --cudnn-wheel nvidia_cudnn_cu12-9.10.2.21-...whl \\
        --out data/07-upgrading/evidence.json

Reads, without installing anything: which APIs each older torch wheel has (PT1509 counts only those 2.15 added),
its `Requires-Python` (PT1508), how many fields its `TensorProperties.__setstate__` unpacks (PT1507), how it reads
`TORCH_DIST_USE_NCCL2`; from the installed torch: the DT_RPATH of `libtorch_cuda.so` and the NCCL entry points it
imports; from the CUDA 12 NCCL and cuDNN wheels: the files they write, which of them land in the folders that
RPATH names, and which imported entry points that NCCL lacks (PT1513). With `--preload-check` it also imports torch
with that NCCL preloaded and records the error. The older torch wheels can be any platform's (the Python source is
the same), e.g. `pip download --no-deps --only-binary=:all: --platform macosx_14_0_arm64 --python-version 3.11
torch==2.14.0`.
`tests/upgrade/test_wheel_evidence.py` checks the rules against the file this writes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

__all__ = ["API_PROBES", "wheel_facts", "installed_facts", "library_wheel_facts", "rpath", "nccl_imports",
           "defined_symbols", "main", "build_stub_nccl", "load_torch_cuda", "import_torch"]

#: Each API a rule could count as new, and the file and text that show a release has it.
API_PROBES: dict[str, tuple[str, str]] = {
    "torch.distributed.fsdp.MixedPrecisionPolicy.param_dtype_override_fn":
        ("torch/distributed/fsdp/_fully_shard/_fsdp_api.py", "param_dtype_override_fn"),
    "torch.distributed._transport": ("torch/distributed/_transport/__init__.py", ""),
    "torch.nn.functional.linear_cross_entropy": ("torch/nn/functional.py", "def linear_cross_entropy"),
    "torch.nn.LinearCrossEntropyLoss": ("torch/nn/modules/loss.py", "class LinearCrossEntropyLoss"),
    "torch.nn.LinearCrossEntropyOptions": ("torch/nn/modules/linear_cross_entropy_options.py",
                                           "class LinearCrossEntropyOptions"),
    "torch.distributed.init_process_group.enable_reconfigure": ("torch/distributed/distributed_c10d.py",
                                                                "enable_reconfigure"),
    "torch.distributed._get_reconfigure_handle": ("torch/distributed/distributed_c10d.py",
                                                  "def _get_reconfigure_handle"),
}


def _pickled_fields(metadata_py: str) -> dict[str, object]:
    """TensorProperties' pickled state: the fields `__getstate__` writes, the sizes `__setstate__` unpacks."""
    i = metadata_py.find("class TensorProperties")
    g = metadata_py.find("def __getstate__", i)
    s = metadata_py.find("def __setstate__", i)
    if i < 0 or g < 0 or s < 0:
        return {"writes": None, "reads": []}
    m = re.search(r"return\s*\(([^()]*?)\)", metadata_py[g: g + 2000], re.S)
    body = metadata_py[s: s + 2500].split("\n    def ", 1)[0]
    unpacks = re.findall(r"\(\s*([^()]*?)\)\s*=\s*state", body, re.S)
    reads = [len([x for x in u.split(",") if x.strip()]) for u in unpacks]
    return {"writes": len([x for x in m.group(1).split(",") if x.strip()]) if m else None, "reads": reads}


def _nccl2_switch(c10d_py: str) -> str | None:
    """The comparison `_register_builtin_nccl_backend` makes on TORCH_DIST_USE_NCCL2 (`== "0"` in 2.15)."""
    i = c10d_py.find("def _register_builtin_nccl_backend")
    m = re.search(r"TORCH_DIST_USE_NCCL2\"\)\s*(==\s*\"\d\")", c10d_py[i: i + 800]) if i >= 0 else None
    return m.group(1).replace(" ", "") if m else None


def _facts(read: callable, version: str, requires_python: str | None) -> dict:  # type: ignore[valid-type]
    apis = {}
    for name, (path, needle) in API_PROBES.items():
        text = read(path)
        apis[name] = text is not None and needle in text
    meta = read("torch/distributed/checkpoint/metadata.py") or ""
    return {"version": version, "requires_python": requires_python, "apis": apis,
            "tensor_properties_pickle": _pickled_fields(meta),
            "use_nccl2_switch": _nccl2_switch(read("torch/distributed/distributed_c10d.py") or "")}


def wheel_facts(wheel: Path) -> dict:
    """What a torch wheel (any platform) has, read from its files."""
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())

        def read(path: str) -> str | None:
            return z.read(path).decode("utf-8", "replace") if path in names else None

        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = z.read(meta_name).decode()
        version = re.search(r"^Version: (\S+)", meta, re.M).group(1)  # type: ignore[union-attr]
        rp = re.search(r"^Requires-Python: (\S+)", meta, re.M)
        return {**_facts(read, version, rp.group(1) if rp else None), "wheel": wheel.name}


def installed_facts() -> dict:
    """The same for the installed torch, and its library facts (RPATH, imported NCCL entry points)."""
    import importlib.metadata

    import torch

    site = Path(torch.__file__).parent.parent

    def read(path: str) -> str | None:
        try:
            return (site / path).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None

    dist = importlib.metadata.distribution("torch")
    out = _facts(read, torch.__version__, dist.metadata.get("Requires-Python"))
    lib = Path(torch.__file__).parent / "lib" / "libtorch_cuda.so"
    if lib.exists() and shutil.which("readelf") and shutil.which("nm"):
        out["libtorch_cuda_rpath"] = rpath(lib)
        out["nccl_imports"] = nccl_imports(lib)
    return out


def rpath(lib: Path) -> list[str]:
    """The DT_RPATH (or DT_RUNPATH) entries of a shared library, `$ORIGIN/../../` removed (`readelf -d`)."""
    out = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout
    m = re.search(r"\((?:RPATH|RUNPATH)\)\s+Library (?:rpath|runpath): \[([^\]]*)\]", out)
    kind = "RUNPATH" if m and "RUNPATH" in out[: m.end()].splitlines()[-1] else "RPATH"
    return [kind] + [p.replace("$ORIGIN/../../", "") for p in (m.group(1).split(":") if m else [])]


def nccl_imports(lib: Path) -> list[str]:
    """The nccl* symbols a library imports, and whether strongly (`U`, not `w`): `nm -D --undefined-only`."""
    out = subprocess.run(["nm", "-D", "--undefined-only", str(lib)], capture_output=True, text=True,
                         check=True).stdout
    return sorted(f"{kind} {name}" for kind, name in re.findall(r"^\s+([Uw])\s+(nccl\w+)", out, re.M))


def defined_symbols(lib: Path) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True,
                         check=True).stdout
    return set(re.findall(r"\s[TtWw]\s+(nccl\w+)", out))


def library_wheel_facts(wheel: Path, folders: Sequence[str], imports: Sequence[str] = (),
                        lib_name: str = "") -> dict:
    """The files a library wheel writes, those inside the folders torch's RPATH names, and (for NCCL) the
    imported entry points its library lacks."""
    with zipfile.ZipFile(wheel) as z:
        files = [n for n in z.namelist() if not n.endswith("/") and ".dist-info/" not in n]
        out = {"wheel": wheel.name, "files": files,
               "in_rpath_folders": [f for f in files if any(f.startswith(d + "/") for d in folders)]}
        if lib_name and imports:
            member = next((f for f in files if f.endswith(lib_name)), None)
            if member:
                with tempfile.TemporaryDirectory() as tmp:
                    path = Path(z.extract(member, tmp))
                    have = defined_symbols(path)
                    need = [s.split()[1] for s in imports]
                    out["missing_entry_points"] = sorted(s for s in need if s not in have)
                    out["preload_lib"] = member
    return out


def mac_facts(wheel: Path) -> dict:
    """A macOS torch wheel: its platform tag and what its libtorch_cpu says about the macOS MPS needs."""
    with zipfile.ZipFile(wheel) as z:
        wheel_info = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/WHEEL"))).decode()
        tag = re.search(r"^Tag: (\S+)", wheel_info, re.M)
        lib = z.read("torch/lib/libtorch_cpu.dylib")
    texts = sorted({m.decode() for m in re.findall(rb"[ -~]{0,60}macOS 1\d[ -~]{0,40}", lib)})
    return {"wheel": wheel.name, "tag": tag.group(1) if tag else None, "macos_strings": texts}


def preload_check(wheel: Path, member: str) -> str:
    """`import torch` with a wheel's library preloaded (LD_PRELOAD): the last line of the error, or "imported"."""
    with zipfile.ZipFile(wheel) as z, tempfile.TemporaryDirectory() as tmp:
        lib = z.extract(member, tmp)
        env = {**os.environ, "LD_PRELOAD": lib}
        proc = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True, env=env,
                              timeout=300, check=False)
    if proc.returncode == 0:
        return "imported"
    last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
    return re.sub(r"/\S*/(torch/lib/)", r"\1", last)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old-wheel", action="append", default=[], help="a torch wheel of an older release")
    ap.add_argument("--nccl-wheel", help="a CUDA 12 NCCL wheel (nvidia-nccl-cu12)")
    ap.add_argument("--cudnn-wheel", help="a CUDA 12 cuDNN wheel (nvidia-cudnn-cu12)")
    ap.add_argument("--mac-wheel", help="the macOS arm64 torch 2.15 wheel (its MPS macOS requirement)")
    ap.add_argument("--preload-check", action="store_true", help="import torch with that NCCL preloaded")
    ap.add_argument("--out", required=True, help="the JSON file to write")
    args = ap.parse_args(argv)
    for w in [*args.old_wheel, args.nccl_wheel, args.cudnn_wheel, args.mac_wheel]:
        if w and not Path(w).is_file():
            ap.error(f"{w}: no such wheel")
    from pt215.upgrade.rules import RPATH_FOLDERS

    installed = installed_facts()
    facts: dict = {"command": "python -m pt215.upgrade.evidence " + " ".join(
        f"--{k.replace('_', '-')} {Path(v).name}" for k, vs in (("old_wheel", args.old_wheel),) for v in vs),
        "installed": installed, "older": [wheel_facts(Path(w)) for w in args.old_wheel]}
    folders = [p for p in installed.get("libtorch_cuda_rpath", [])[1:] if p.startswith("nvidia/")] or list(
        RPATH_FOLDERS)
    if args.nccl_wheel:
        facts["nccl_cu12"] = library_wheel_facts(Path(args.nccl_wheel), folders,
                                                 installed.get("nccl_imports", []), "libnccl.so.2")
        if args.preload_check and "preload_lib" in facts["nccl_cu12"]:
            facts["nccl_cu12"]["import_torch_with_it_preloaded"] = preload_check(
                Path(args.nccl_wheel), facts["nccl_cu12"]["preload_lib"])
        facts["command"] += f" --nccl-wheel {Path(args.nccl_wheel).name}"
    if args.cudnn_wheel:
        facts["cudnn_cu12"] = library_wheel_facts(Path(args.cudnn_wheel), folders)
        facts["command"] += f" --cudnn-wheel {Path(args.cudnn_wheel).name}"
    if args.mac_wheel:
        facts["mac_215"] = mac_facts(Path(args.mac_wheel))
        facts["command"] += f" --mac-wheel {Path(args.mac_wheel).name}"
    if args.preload_check:
        facts["command"] += " --preload-check"
    Path(args.out).write_text(json.dumps(facts, indent=1) + "\n")
    new = sorted(n for n, has in installed["apis"].items() if has and not any(o["apis"][n] for o in facts["older"]))
    print(f"APIs in {installed['version']} and in no older wheel given: {', '.join(new) or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


# ---------------------------------------------------------------- which libnccl.so.2 torch maps (notebook 7.1)

_STUB = "int ncclGetVersion(int *v) {{ *v = {code}; return 0; }}\n"
_LOAD = r"""
import ctypes, json, os, sys
lib, error = sys.argv[1], None
try:
    ctypes.CDLL(lib)
except OSError as e:
    error = str(e).split(": ", 1)[-1]
maps = [l.split()[-1] for l in open("/proc/self/maps") if "libnccl" in l]
print(json.dumps({"mapped": sorted(set(maps)), "error": error}))
"""


def build_stub_nccl(folder: Path, symbols: Sequence[str] = (), version_code: int = 22703) -> Path:
    """A stand-in `libnccl.so.2` (soname libnccl.so.2) that defines ncclGetVersion and no-op `symbols`."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("build_stub_nccl needs a C compiler (cc or gcc)")
    folder.mkdir(parents=True, exist_ok=True)
    src = folder / "stub_nccl.c"
    src.write_text(_STUB.format(code=version_code) + "".join(f"int {s}(void) {{ return 0; }}\n"
                                                             for s in symbols if s != "ncclGetVersion"))
    out = folder / "libnccl.so.2"
    subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libnccl.so.2", "-o", str(out), str(src)], check=True,
                   capture_output=True, timeout=120)
    return out


_IMPORT = r"""
import ctypes, json, os
error, bound = None, None
try:
    import torch
except Exception as e:
    error = f"{type(e).__name__}: {str(e).splitlines()[0]}"
maps = [l.split()[-1] for l in open("/proc/self/maps") if "libnccl" in l]
if error is None:
    try:
        code = ctypes.c_int(0)
        ctypes.CDLL("libnccl.so.2", mode=getattr(os, "RTLD_NOLOAD", 4)).ncclGetVersion(ctypes.byref(code))
        bound = code.value
    except Exception:
        pass
print(json.dumps({"mapped": sorted(set(maps)), "error": error, "bound_version": bound}))
"""


def _shown(res: dict[str, object], site: str) -> dict[str, object]:
    """Paths inside torch's site-packages folder relative to it, any other as `<other>/name`; no machine paths."""
    res["mapped"] = [m[len(site) + 1:] if m.startswith(site + "/") else f"<other>/{Path(m).name}"
                     for m in res["mapped"]]  # type: ignore[union-attr]
    if res["error"]:
        res["error"] = re.sub(r"/\S*/(torch/lib/)", r"\1", str(res["error"]))
    return res


def load_torch_cuda(env: dict[str, str]) -> dict[str, object]:
    """The dynamic linker alone: `ctypes.CDLL(libtorch_cuda.so)` in a fresh process with `env` added (its DT_RPATH,
    LD_LIBRARY_PATH, LD_PRELOAD): which libnccl.so.2 got mapped (a path inside torch's site-packages folder, or
    `<other>/...`), and the loader's error if any. Not what `import torch` does: that preloads NCCL first
    (`import_torch`)."""
    import torch

    torch_lib = Path(torch.__file__).parent / "lib" / "libtorch_cuda.so"
    site = str(Path(torch.__file__).resolve().parent.parent)
    proc = subprocess.run([sys.executable, "-c", _LOAD, str(torch_lib)], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300, check=True)
    return _shown(json.loads(proc.stdout), site)


def import_torch(env: dict[str, str]) -> dict[str, object]:
    """`import torch` in a fresh process with `env` added (PYTHONPATH replaced when given): every libnccl.so.2
    mapped (as in `load_torch_cuda`), the version that the one torch bound reports (`ncclGetVersion` of the
    first libnccl.so.2 loaded, found by soname without loading anything; None when the import failed), and the
    import error if any. `torch/__init__.py` (`_load_global_deps` -> `_preload_cuda_deps(required=False)`)
    loads `nvidia/nccl/lib/libnccl.so.*` from the first `sys.path` entry that has one before `libtorch_cuda.so`;
    `libtorch_cuda.so`'s DT_RPATH decides only when nothing was loaded before it."""
    import torch

    site = str(Path(torch.__file__).resolve().parent.parent)
    run_env = {**os.environ, **env}
    if "PYTHONPATH" not in env:
        run_env.pop("PYTHONPATH", None)
    proc = subprocess.run([sys.executable, "-c", _IMPORT], capture_output=True, text=True, env=run_env,
                          timeout=600, check=True)
    return _shown(json.loads(proc.stdout.strip().splitlines()[-1]), site)
