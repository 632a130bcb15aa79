"""The pattern half of `python -m pt215.upgrade` (chapter 7): shell, Dockerfiles, YAML, TOML, INI, JSON and
requirements files, line by line (CI workflows per job: `pt215.upgrade.ci`).

Where teams keep their pins: `ENV PYTHON_VERSION=3.10` and `FROM python:3.10` in a Dockerfile,
`conda create ... python=3.10`, a `whl/cu126` index (also one built from a variable, `ARG CUDA_VERSION_PATH=cu128`
... `whl/${CUDA_VERSION_PATH}`), an `nvidia-cudnn-cu12==9.x` pin, a CUDA 12 devel base image on which extensions
are built, an image that names an old torch/CUDA pair, and the env blocks of Slurm, Ray or Kubernetes. Also the
PEP 440 subset the scanner needs to read version specifiers (`admits`).

Every file is read in linear time: a file, then each of its lines, goes through the checks only when it holds one
of the words they look for (`TRIGGER_WORDS`, plain substring tests), so a 3 MB file of golden values costs a few
milliseconds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pt215.upgrade.rules import (
    ACC_POLICIES,
    CUDNN_215,
    FR_LEGACY,
    FR_MISSING,
    NCCL_215,
    NO_WEIGHTS_ONLY,
    UNREAD_215,
    USE_NCCL2,
    Finding,
    finding,
)

__all__ = ["ENV_RE", "LEGACY_BACKEND_RE", "TARGET_RE", "TRIGGER_WORDS", "has_trigger", "TextResult", "LineEdit",
           "admits", "below_215", "oldest_python", "env_finding", "requirement_hits", "image_hits", "scan_patterns",
           "expand_vars", "installs_torch", "builds_extensions", "recipe_pin", "classifier_deletions",
           "python_checks_wanted"]

ENV_NAMES = {**{k: "PT1501" for k in FR_LEGACY}, FR_MISSING: "PT1502", USE_NCCL2: "PT1503",
             NO_WEIGHTS_ONLY: "PT1510", **{k: "PT1514" for k in UNREAD_215}}
ENV_RE = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(map(re.escape, ENV_NAMES)) + r")(?![A-Za-z0-9_])")
#: The value right after a name in `NAME=0`, `NAME: "0"`, `NAME = '0'` or `{"NAME": "0"}`.
ENV_VALUE_RE = re.compile(r"""\s*["']?\s*[:=]\s*["']?([\w.-]*)""")
LEGACY_BACKEND_RE = re.compile(r"(?<![\w-])nccl-legacy(?![\w-])")
TARGET_RE = re.compile(r"TORCH_TARGET_VERSION\s*[=\s]\s*\(?\s*(0[xX][0-9a-fA-F]+|\d+)")
#: A file, then a line, goes through the checks only if it holds one of these words (case-insensitive). Each is
#: a plain substring test (`in`, a fast search in C), so a megabyte of numbers costs milliseconds.
TRIGGER_WORDS = ("torch", "nccl", "cudnn", "cuda", "cu1", "python", "acc_policy", "param_dtype", "std=", "std:",
                 "cxx_std", "cxx_standard", "classifiers", "programming language")


def has_trigger(text: str) -> bool:
    """Does `text` hold any word a rule looks for? (One pass per word over the lower-cased text.)"""
    low = text.lower()
    return any(w in low for w in TRIGGER_WORDS)
SPEC = r"(?:===?|!=|~=|<=|>=|<|>)\s*[\w.*+!-]+(?:\s*,\s*(?:===?|!=|~=|<=|>=|<|>)\s*[\w.*+!-]+)*"
TORCH_REQ_RE = re.compile(r"(?<![\w.-])torch\s*(?:\[[^\]]*\])?\s*(" + SPEC + ")")
CONDA_TORCH_RE = re.compile(r"^\s*-\s*[\"']?(?:pytorch|torch)\s*=\s*([\d][\w.*]*)")
CONDA_PY_RE = re.compile(r"^\s*-\s*[\"']?python\s*(=|==|<=|>=|<|>|~=)?\s*(\d+\.\d+)")
DOCKER_FROM_RE = re.compile(r"^\s*FROM\s+(?:--platform=\S+\s+)?(\S+)", re.IGNORECASE)
IMAGE_PY_RE = re.compile(r"(?:^|[/:])python:(3\.\d+)|[-_:.]py(3)\.?(\d{1,2})(?![\d.])")
DOCKER_ENV_PY_RE = re.compile(r"^\s*(?:ENV|ARG)\s+(?:\S+=\S*\s+)*(PYTHON_VERSION|PY_VERSION|PYTHON)[= ]\s*"
                              r"[\"']?(3\.\d+)", re.IGNORECASE)
INSTALL_PY_RE = re.compile(r"(?:conda|mamba|micromamba)\s+(?:create|install)\b[^#\n]*?\bpython\s*=\s*[\"']?(3\.\d+)"
                           r"|uv\s+(?:venv|python\s+install)\b[^#\n]*?(?:--python\s+|\s)(3\.\d+)"
                           r"|pyenv\s+(?:install|global|local)\s+(3\.\d+)"
                           r"|apt(?:-get)?\s+install\b[^#\n]*?\bpython(3\.\d+)\b")
CU12_INDEX_RE = re.compile(r"download\.pytorch\.org/whl/(?:nightly/|test/)?(cu1[0-2]\d)(?!\d)")
CU12_LIB_RE = re.compile(r"(?<![\w-])(nvidia-[a-z0-9-]+-cu1[12])(?![\w-])(\s*(?:===?|~=|>=|<=|<|>|!=)\s*\d)?")
INSTALL_RE = re.compile(r"\b(?:pip3?|uv\s+pip|conda|mamba)\s+install\b|\buv\s+add\b")
UNINSTALL_RE = re.compile(r"uninstall|--no-install-package|sed\s|/d'|\bremove\b|exclude", re.IGNORECASE)
CU12_LOCAL_RE = re.compile(r"(?<![\w.-])torch(?:vision|audio)?\s*==\s*[\d.]+\+(cu1[0-2]\d)(?!\d)")
NCCL_PIP_RE = re.compile(r"(?<![\w-])(nvidia-nccl-cu1\d)\s*==\s*(\d+\.\d+(?:\.\d+)?)")
NCCL_APT_RE = re.compile(r"(?<![\w-])libnccl(?:2|-dev)\s*=\s*(\d+\.\d+\.\d+)")
CUDNN_PIP_RE = re.compile(r"(?<![\w-])(nvidia-cudnn-cu1\d)\s*==\s*(\d+\.\d+(?:\.\d+)*)")
CUDNN_APT_RE = re.compile(r"(?<![\w-])libcudnn\d(?:-dev)?(?:-cuda-\d+)?\s*=\s*(\d+\.\d+\.\d+)")
#: An image reference: a token with a slash (registry/name) and an optional tag.
IMAGE_TOKEN_RE = re.compile(r"(?<![\w./-])(?:docker:)?((?:[\w.-]+/)+[\w.-]+(?::[\w.+-]+)?)")
#: CUDA 12 or older named in an image token next to a torch version: `tch291cu128`, `-cu124-...-torch2.6`.
STACK_CUDA_RE = re.compile(r"(?:^|[-_:.]|(?<=\d))cu(?:da)?-?(1[0-2])\.?(\d)(?!\d{2})")
STACK_TORCH_RE = re.compile(r"(?<![a-z])(?:py)?(?:torch|tch)(?:[-_][a-z]+)*[-_:]?\d", re.IGNORECASE)
TOOLKIT_IMAGE_RE = re.compile(r"(?:^|/)nvidia/cuda:(1[0-2])\.(\d+)(?:\.\d+)?-(?:[\w.]+-)*devel", re.IGNORECASE)
#: A file that builds native code against the torch it installed (a CUDA toolkit image then matters).
BUILD_RE = re.compile(r"--no-build-isolation|setup\.py\s+(?:install|develop|build_ext|bdist_wheel)|"
                      r"TORCH_CUDA_ARCH_LIST|\bnvcc\b|MAX_JOBS=|(?:pip3?|uv\s+pip)\s+install[^\n]*"
                      r"(?:flash[-_]attn|\bapex\b|transformer[-_]engine|deepspeed|grouped[-_]gemm|xformers)",
                      re.IGNORECASE)
#: Installing torch, or a project (which brings torch): pip/uv/conda/poetry.
INSTALLS_TORCH_RE = re.compile(
    r"(?:pip3?|uv\s+pip|conda|mamba)\s+install\b[^\n]*?(?:(?<![\w-])(?:torch|pytorch)(?![\w-])|(?:\s-e\s*|\s)"
    r"[\"']?\.(?:\[[^\]]*\])?[\"']?(?:\s|$)|\s-e\s+\S)|\buv\s+sync\b|\bpoetry\s+install\b|"
    r"setup\.py\s+(?:install|develop)|download\.pytorch\.org", re.MULTILINE)
#: A path component that names the stack a recipe builds: `verl0.4-cu124-torch2.6-fa2.7.4`, `Dockerfile.torch2.7.1`.
RECIPE_RE = re.compile(r"(?:torch|tch)[-_]?(\d\.\d+)|(?<![a-z\d])(cu1[0-2]\d)(?!\d)", re.IGNORECASE)
CLASSIFIER_RE = re.compile(r"""^\s*["']Programming Language :: Python :: 3\.(\d+)["']\s*,?\s*(?:#.*)?$""")
VAR_RE = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}|\$(\w+)")
ASSIGN_RE = re.compile(r"^\s*(?:ARG|ENV|export|declare\s+-x|local)?\s*(\w+)=([^\s;#]*)")
FP32_VALUES = {"fp32", "float32", "float", "torch.float32", "torch.float", "32"}
NOQA_RE = re.compile(r"#\s*noqa(?::\s*([A-Z]+\d+(?:[\s,]+[A-Z]+\d+)*))?", re.IGNORECASE)


@dataclass(frozen=True)
class LineEdit:
    """A whole-line rewrite for `--fix`, applied when the finding at `key` (code, line) is reported: line `target`
    becomes `text`, or is deleted when `text` is None."""

    code: str
    key: int
    target: int
    text: str | None


@dataclass
class TextResult:
    findings: list[Finding] = field(default_factory=list)
    pins: list[tuple[int, str]] = field(default_factory=list)
    edits: list[LineEdit] = field(default_factory=list)


# ---------------------------------------------------------------- version specifiers (PEP 440 subset)


def _vtuple(text: str) -> tuple[int, ...]:
    m = re.match(r"v?(\d+(?:\.\d+)*)", text.split("+")[0].strip())
    if not m:
        raise ValueError(f"not a version: {text!r}")
    return tuple(int(x) for x in m.group(1).split("."))


def _cmp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = max(len(a), len(b))
    a, b = a + (0,) * (n - len(a)), b + (0,) * (n - len(b))
    return (a > b) - (a < b)


def _clause(version: tuple[int, ...], clause: str) -> bool:
    m = re.match(r"\s*(===?|!=|~=|<=|>=|<|>|\^|~)?\s*([\w.*+!-]+)\s*$", clause)
    if not m:
        raise ValueError(f"not a version specifier: {clause!r}")
    op, ver = m.group(1) or "==", m.group(2)
    if ver.endswith(".*"):
        prefix = _vtuple(ver[:-2])
        same = (version + (0,) * len(prefix))[: len(prefix)] == prefix
        if op in ("==", "==="):
            return same
        if op == "!=":
            return not same
        raise ValueError(f"wildcard only with == or !=: {clause!r}")
    v = _vtuple(ver)
    c = _cmp(version, v)
    if op == "~=":  # compatible release: >= v, same prefix without the last part
        return c >= 0 and (version + (0,) * len(v))[: len(v) - 1] == v[:-1]
    if op == "^":  # Poetry caret: same first non-zero part
        nz = next((i for i, x in enumerate(v) if x != 0), len(v) - 1)
        return c >= 0 and _cmp(version, v[:nz] + (v[nz] + 1,)) < 0
    if op == "~":  # Poetry tilde: >= v, < next minor (or next major when only a major is given)
        upper = (v[0] + 1,) if len(v) == 1 else (v[0], v[1] + 1)
        return c >= 0 and _cmp(version, upper) < 0
    return {"==": c == 0, "===": c == 0, "!=": c != 0, "<=": c <= 0, ">=": c >= 0, "<": c < 0, ">": c > 0}[op]


def admits(spec: str, version: str | tuple[int, ...]) -> bool:
    """Does a specifier (`>=3.9`, `>=2.4,<2.15`, `^3.10`, `3.10.*`, Poetry `a || b`) admit `version`?"""
    v = _vtuple(version) if isinstance(version, str) else version
    return any(all(_clause(v, c) for c in alt.split(",") if c.strip()) for alt in spec.split("||"))


_OLD_PYTHONS = [(3, m, p) for m in range(0, 11) for p in (0, 99)]
_TORCH_215_PLUS = [(2, 15, 0), (2, 15, 9), (2, 16, 0), (2, 30, 0), (3, 0, 0)]


def oldest_python(spec: str) -> str | None:
    """The newest Python <= 3.10 that `spec` admits ("3.10"), or None when it admits none."""
    try:
        hits = [v for v in _OLD_PYTHONS if admits(spec, v)]
    except ValueError:
        return None
    return f"{hits[-1][0]}.{hits[-1][1]}" if hits else None


def below_215(spec: str) -> bool:
    """A torch specifier that admits some release but no 2.15 or newer one."""
    try:
        older = [(2, m, p) for m in range(15) for p in (0, 1, 2, 9)]
        older += [v for v in (_vtuple(x) for x in re.findall(r"\d+(?:\.\d+)*", spec)) if _cmp(v, (2, 15)) < 0]
        return not any(admits(spec, v) for v in _TORCH_215_PLUS) and any(admits(spec, v) for v in older)
    except ValueError:
        return False


def _old(version: str) -> bool:
    return _cmp(_vtuple(version), (3, 11)) < 0


# ---------------------------------------------------------------- shared checks (also used on Python strings)


def env_finding(path: str, line: int, name: str, fr_new: set[str] | frozenset[str] = frozenset(),
                value: str | None = None) -> Finding | None:
    """The finding for an environment variable `name` (with the `value` it is set to, None if none is seen),
    or None for a legacy FR name already paired with its TORCH_FR_* name in the same file."""
    code = ENV_NAMES[name]
    if code == "PT1501":
        if FR_LEGACY[name] in fr_new:
            return None
        return finding(path, line, code, name=name, new=FR_LEGACY[name])
    if code == "PT1503":
        if value == "0":
            return finding(path, line, "PT1503")
        what = f"{name}={value}" if value else f"{name} is read here"
        return finding(path, line, "PT1517", what=what)
    if code == "PT1510":
        if value is not None and value.strip("\"'").lower() not in _TRUTHY:
            return None  # serialization.py acts only on "1", "y", "yes", "true": this value does nothing
        return finding(path, line, code, what=f"{name}=1 makes every torch.load without weights_only= that")
    if code == "PT1514":
        return finding(path, line, code, name=name, why=UNREAD_215[name])
    return finding(path, line, code)


#: Values serialization.py reads as "set" for TORCH_FORCE_(NO_)WEIGHTS_ONLY_LOAD (`true_values`, lower-cased).
_TRUTHY = frozenset({"1", "y", "yes", "true"})


def env_value(text: str, end: int) -> str | None:
    """The value set right after a variable name that ends at `end` in `text` (`X=0`, `X: "0"`), or None."""
    m = ENV_VALUE_RE.match(text, end)
    return m.group(1) if m and m.group(1) else None


_NCCL_FIX = ("{pkg}=={version} installs nvidia/nccl/lib/libnccl.so.2, the file the 2.15 wheel's libtorch_cuda.so "
             "finds first through its RPATH (cu12 and cu13 packages have different names, so pip installs both and "
             "the one written last wins). An NCCL without every entry point 2.15 imports makes `import torch` fail "
             "(2.27.3 lacks 16, e.g. ncclCommResume): drop the pin and let torch bring nvidia-nccl-cu13=={need}")
_CUDNN_FIX = ("{pkg}=={version} installs nvidia/cudnn/lib/libcudnn*.so.9, the files the 2.15 wheel finds first "
              "through its RPATH, replacing the cuDNN {need} it requires (cu12 and cu13 packages have different "
              "names, so pip installs both and the one written last wins): drop the pin")


#: The two libraries whose pins PT1513/PT1518 read: (name, pip pin, apt pin, what 2.15 requires, fix, library,
#: the site-packages folder the wheel's RPATH names).
_LIBRARIES = (
    ("NCCL", NCCL_PIP_RE, NCCL_APT_RE, NCCL_215, _NCCL_FIX, "libnccl.so.2", "nvidia/nccl/lib"),
    ("cuDNN", CUDNN_PIP_RE, CUDNN_APT_RE, CUDNN_215, _CUDNN_FIX, "libcudnn.so.9", "nvidia/cudnn/lib"),
)


def requirement_hits(text: str, pip_base: str | None = None) -> list[tuple[int, str, dict[str, object]]]:
    """CUDA 12 wheels, libraries and images, NCCL and cuDNN below what 2.15 requires, in any text:
    (offset, code, fmt). `pip_base`: the base image of the Dockerfile the text is a line of, when that image's
    torch is a pip build (pip_torch_base of the whole file); otherwise read from `text` itself."""
    out: list[tuple[int, str, dict[str, object]]] = []
    for m in CU12_INDEX_RE.finditer(text):
        out.append((m.start(), "PT1512", {"what": f"the wheel index whl/{m.group(1)}"}))
    for m in CU12_LIB_RE.finditer(text):
        line_start = text.rfind("\n", 0, m.start()) + 1
        line_end = text.find("\n", m.end())
        line = text[line_start: line_end if line_end >= 0 else len(text)]
        if UNINSTALL_RE.search(line):
            continue
        if m.group(2) or INSTALL_RE.search(line):
            out.append((m.start(), "PT1512", {"what": m.group(1)}))
    for m in CU12_LOCAL_RE.finditer(text):
        out.append((m.start(), "PT1512", {"what": f"the +{m.group(1)} wheel"}))
    for name, pip_re, apt_re, need, fix, lib, folder in _LIBRARIES:
        need_text = ".".join(map(str, need))
        for m in pip_re.finditer(text):
            if _cmp(_vtuple(m.group(2))[:len(need)], need) < 0:
                out.append((m.start(), "PT1513", {"what": f"the pip {name} {m.group(1)}", "version": m.group(2),
                                                  "need": f"{name} {need_text}", "fix": fix.format(
                                                      pkg=m.group(1), version=m.group(2), need=need_text)}))
        for m in apt_re.finditer(text):
            fmt = {"what": f"the system {name} ({lib.split('.')[0]})", "version": m.group(1), "lib": lib,
                   "folder": folder}
            base = pip_base or pip_torch_base(text)
            if base is not None:  # an image whose torch is a pip wheel, which loads the wheel's own library
                out.append((m.start(), "PT1520", {**fmt, "base": base}))
            else:
                out.append((m.start(), "PT1518", fmt))
    for offset, image, cuda in image_hits(text):
        out.append((offset, "PT1512", {"what": f"the image {image} (torch with CUDA {cuda})"}))
    return out


_FROM_LINES_RE = re.compile(DOCKER_FROM_RE.pattern, re.IGNORECASE | re.MULTILINE)
#: Base images whose torch is built against the system NCCL and cuDNN (NGC's PyTorch containers).
SYSTEM_TORCH_IMAGE_RE = re.compile(r"nvcr\.io/nvidia/pytorch|(?:^|/)pytorch:\d\d\.\d\d-py3", re.IGNORECASE)


def pip_torch_base(text: str) -> str | None:
    """The base image of a Dockerfile none of whose `FROM` images is NGC's PyTorch (so the torch it runs is a
    pip or conda build that loads its own NCCL and cuDNN), or None: not a Dockerfile, or built on NGC's PyTorch
    (whose torch loads the system libraries an apt pin installs). A shell script has no `FROM`: None."""
    bases = [m.group(1) for m in _FROM_LINES_RE.finditer(text)]
    if not bases or any(SYSTEM_TORCH_IMAGE_RE.search(b) for b in bases):
        return None
    return bases[-1]


def image_hits(text: str) -> list[tuple[int, str, str]]:
    """Images that name a torch build for CUDA 12 or older (`olmo-core-tch291cu128`, `verl:...-cu124-...-torch2.6`):
    (offset, image, "12.8")."""
    if "/" not in text:
        return []
    out = []
    for m in IMAGE_TOKEN_RE.finditer(text):
        image = m.group(1)
        if "download.pytorch.org" in image or "/whl/" in image or image.startswith(("http", "git")):
            continue
        low = image.lower()
        cuda = STACK_CUDA_RE.search(low)
        if cuda and STACK_TORCH_RE.search(low) and "nvidia/cuda:" not in low:
            out.append((m.start(1), image, f"{cuda.group(1)}.{cuda.group(2)}"))
    return out


def toolkit_image(image: str) -> str | None:
    """The CUDA version ("12.8") of an `nvidia/cuda:12.x-...devel` image, or None."""
    m = TOOLKIT_IMAGE_RE.search(image)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def installs_torch(text: str) -> bool:
    """Does this shell/CI text install torch or a project (which brings torch)?"""
    return bool(INSTALLS_TORCH_RE.search(text))


def builds_extensions(text: str) -> bool:
    """Does this text build native code (where a CUDA toolkit image matters)?"""
    return bool(BUILD_RE.search(text))


def recipe_pin(path: str) -> str | None:
    """The stack a recipe's path names (`torch 2.6, cu124`), or None: a file under `verl0.4-cu124-torch2.6/`
    builds that stack and stays as it is when a team moves to 2.15."""
    parts = re.split(r"[\\/]", path)[:-1] + [path.rsplit("/", 1)[-1]]
    for part in reversed(parts):
        hits = RECIPE_RE.findall(part)
        if hits:
            torch_v = next((t for t, _ in hits if t), None)
            cuda_v = next((c for _, c in hits if c), None)
            if torch_v and _cmp(_vtuple(torch_v), (2, 15)) >= 0:
                return None
            return ", ".join(x for x in (f"torch {torch_v}" if torch_v else "", cuda_v or "") if x)
    return None


def expand_vars(line: str, values: dict[str, str]) -> str:
    """`line` with `${X}`, `${X:-default}` and `$X` replaced by the values seen (Dockerfile ARG/ENV, shell X=)."""
    if "$" not in line:
        return line

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(3)
        if name in values:
            return values[name]
        return m.group(2) if m.group(2) is not None else m.group(0)

    for _ in range(3):  # nested: DEVEL_BASE_IMAGE=nvidia/cuda:${CUDA_VERSION}-devel
        new = VAR_RE.sub(sub, line)
        if new == line:
            break
        line = new
    return line


def classifier_deletions(lines: list[str], key: int, code: str = "PT1508") -> list[LineEdit]:
    """`--fix` deletions of the `Programming Language :: Python :: 3.10` (and older) classifier lines, applied
    with the requires-python edit at line `key`, so that the classifiers agree with the requirement."""
    out = []
    for n, line in enumerate(lines, 1):
        m = CLASSIFIER_RE.match(line)
        if m and int(m.group(1)) <= 10:
            out.append(LineEdit(code, key, n, None))
    return out


# ---------------------------------------------------------------- files by pattern


def _strip_comment(line: str, kind: str) -> str:
    if kind == "json":
        return line
    if kind == "ini" and line.lstrip().startswith(";"):
        return ""
    if line.lstrip().startswith("#"):
        return ""
    m = re.search(r"\s#", line)
    return line[: m.start()] if m else line


def _block(lines: list[str], i: int, kind: str) -> list[str]:
    """The stripped lines that share line i's YAML block (same indentation) or TOML/INI section."""
    if kind != "yaml":
        start = next((j for j in range(i, -1, -1) if re.match(r"\s*\[", lines[j])), -1)
        end = next((j for j in range(i + 1, len(lines)) if re.match(r"\s*\[", lines[j])), len(lines))
        return [s.strip() for s in lines[start + 1: end]]
    indent = len(lines[i]) - len(lines[i].lstrip())
    out = []
    for rng in (range(i - 1, -1, -1), range(i + 1, len(lines))):
        for j in rng:
            s = lines[j]
            if not s.strip() or s.lstrip().startswith("#"):
                continue
            ind = len(s) - len(s.lstrip())
            if ind < indent:
                break
            if ind == indent:
                out.append(s.strip())
    return out


def python_checks_wanted(text: str, kind: str) -> bool:
    """Does a Python version in this Dockerfile or script matter? Only where torch is installed in it."""
    return kind not in ("dockerfile", "shell") or installs_torch(text)


def scan_patterns(text: str, path: str, kind: str, *, ci: bool = False) -> TextResult:
    """Scan a non-Python file line by line. `ci`: a CI definition, whose Python versions `pt215.upgrade.ci`
    reads per job (here only the variables, indexes, libraries and images)."""
    res = TextResult()
    if not has_trigger(text):
        return res
    lines = text.splitlines()
    fr_new = set(re.findall(r"TORCH_FR_[A-Z_]+", text)) if "TORCH_FR_" in text else set()
    section = ""
    values: dict[str, str] = {}
    track_vars = kind in ("dockerfile", "shell", "make") and "$" in text
    py_wanted = not ci and python_checks_wanted(text, kind)
    builds = kind == "dockerfile" and builds_extensions(text)
    docker_pip_base = pip_torch_base(text) if kind == "dockerfile" else None

    def add(n: int, code: str, **fmt: object) -> None:
        res.findings.append(finding(path, n, code, **fmt))

    for n, raw in enumerate(lines, 1):
        line = _strip_comment(raw, kind)
        if not line.strip():
            continue
        plain = line  # a Python version is reported where it is written, not where a variable carries it
        if track_vars:
            m = ASSIGN_RE.match(line)
            if m and m.group(2):
                values[m.group(1)] = expand_vars(m.group(2).strip("\"'"), values)
            line = expand_vars(line, values)
        if kind in ("toml", "ini") and line.lstrip().startswith("["):
            section = line.strip()
        if "TORCH_" in line:
            for m in ENV_RE.finditer(line):
                value = env_value(line, m.end())
                if value is None and kind == "yaml" and n < len(lines):  # `- name: X` then `value: "0"`
                    nxt = re.match(r"""\s*value\s*:\s*["']?([\w.-]*)""", lines[n])
                    value = nxt.group(1) if nxt else None
                f = env_finding(path, n, m.group(1), fr_new, value)
                if f:
                    res.findings.append(f)
            for m in TARGET_RE.finditer(line):
                v = int(m.group(1), 0) if re.fullmatch(r"0[xX][0-9a-fA-F]+|\d+", m.group(1)) else 0
                if (v >> 56, (v >> 48) & 0xFF) > (2, 15):
                    add(n, "PT1511", value=m.group(1), target=f"{v >> 56}.{(v >> 48) & 0xFF}")
        if not has_trigger(line):
            if py_wanted and plain is not line and has_trigger(plain):
                _python_checks(res, lines, n, plain, kind, section, add)
            continue
        if "nccl-legacy" in line and LEGACY_BACKEND_RE.search(line):
            add(n, "PT1504")
        for _, code, fmt in requirement_hits(line, docker_pip_base):
            add(n, code, **fmt)
        if kind == "dockerfile":
            m = DOCKER_FROM_RE.match(line)
            cuda = toolkit_image(m.group(1)) if m else None
            if cuda and builds:
                add(n, "PT1512", what=f"the CUDA {cuda} devel base image {m.group(1)}, on which extensions are built,")
        if "acc_policy" in line:
            m = re.match(r"""\s*-?\s*["']?acc_policy["']?\s*[:=]\s*["']?([\w-]+)""", line)
            if m and m.group(1) not in ACC_POLICIES:
                add(n, "PT1506", value=m.group(1))
        if "param_dtype" in line and kind in ("yaml", "toml", "ini"):
            _config_policy(res, lines, n, line, kind, path)
        if py_wanted:
            _python_checks(res, lines, n, plain, kind, section, add)
        for m in TORCH_REQ_RE.finditer(line):
            res.pins.append((n, m.group(1)))
        if kind == "yaml":
            m = CONDA_TORCH_RE.match(line)
            if m:
                res.pins.append((n, f"=={m.group(1)}" if "*" in m.group(1) else f"=={m.group(1)}.*"))
        if kind == "toml":
            m = re.match(r"""\s*torch\s*=\s*(?:["']([^"']+)["']|\{[^}]*version\s*=\s*["']([^"']+)["'])""", line)
            if m:
                spec = m.group(1) or m.group(2)
                res.pins.append((n, spec if re.match(r"\s*[<>=!~^]", spec) else f"=={spec}"))
        if "torch.load(" in line and re.search(r"(?<![\w.])torch\.load\(.*weights_only\s*=\s*False", line):
            add(n, "PT1510", what="torch.load(..., weights_only=False)")
        elif "torch.load(" in line and re.search(r"(?<![\w.])torch\.load\(.*pickle_module\s*=\s*(?!None\b)\w",
                                                line) and not re.search(r"weights_only\s*=\s*True", line):
            add(n, "PT1510", what="torch.load(..., pickle_module=...) without weights_only=True turns weights-only "
                                  "loading off and")
    return res


def _config_policy(res: TextResult, lines: list[str], n: int, line: str, kind: str, path: str) -> None:
    """FSDP2 mixed precision in a config: param_dtype set (not fp32), reduce_dtype missing or null."""
    m = re.match(r"""\s*["']?param_dtype["']?\s*[:=]\s*["']?([\w.]+)""", line)
    if not m or m.group(1).lower() in {"null", "none", "~"} | FP32_VALUES:
        return
    red = [s for s in _block(lines, n - 1, kind) if re.match(r"""["']?reduce_dtype["']?\s*[:=]""", s)]
    if not red:
        res.findings.append(finding(path, n, "PT1505", param=m.group(1), how="no reduce_dtype"))
    elif re.search(r"[:=]\s*[\"']?(null|None|none|~)?[\"']?\s*$", red[0]):
        res.findings.append(finding(path, n, "PT1505", param=m.group(1), how="reduce_dtype=None"))


def _python_checks(res: TextResult, lines: list[str], n: int, line: str, kind: str, section: str,
                   add) -> None:  # noqa: ANN001 - the closure of scan_patterns
    m = re.match(r"""(\s*)(requires-python|python_requires|python)(\s*=\s*)(["']?)([^"'#]+?)(["']?)\s*,?\s*$""", line)
    if m and (m.group(2) != "python" or "poetry" in section) and kind in ("toml", "ini"):
        low = oldest_python(m.group(5))
        if low:
            add(n, "PT1508", what=f"{m.group(2)} {m.group(5).strip()!r}", low=low)
            if re.fullmatch(r"\s*>=\s*3(\.\d+)*\s*", m.group(5)):
                raw = lines[n - 1]
                res.edits.append(LineEdit("PT1508", n, n, raw.replace(m.group(5), ">=3.11", 1)))
                res.edits.extend(classifier_deletions(lines, n))
    if kind == "yaml":
        m = CONDA_PY_RE.match(line)
        if m:
            spec = f"{m.group(1) or '=='}{m.group(2)}" if m.group(1) not in (None, "=") else f"=={m.group(2)}.*"
            low = oldest_python(spec)
            if low:
                add(n, "PT1508", what=f"the environment's python {m.group(2)}", low=low)
    if kind == "dockerfile":
        m = DOCKER_FROM_RE.match(line)
        if m:
            im = IMAGE_PY_RE.search(m.group(1))
            if im:
                ver = im.group(1) or f"{im.group(2)}.{im.group(3)}"
                if _old(ver):
                    add(n, "PT1508", what=f"the base image {m.group(1)}", low=ver)
        m = DOCKER_ENV_PY_RE.match(line)
        if m and _old(m.group(2)):
            add(n, "PT1508", what=f"{m.group(1)}={m.group(2)}", low=m.group(2))
    if kind in ("dockerfile", "shell", "yaml", "make"):
        m = INSTALL_PY_RE.search(line)
        if m:
            ver = next(g for g in m.groups() if g)
            if _old(ver):
                add(n, "PT1508", what=f"the interpreter installed here (python {ver})", low=ver)
