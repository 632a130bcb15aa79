"""The pattern half of `python -m pt215.upgrade` (chapter 7): shell, Dockerfiles, CI workflows, YAML, TOML, INI,
JSON and requirements files, line by line.

Where teams keep their pins: `ENV PYTHON_VERSION=3.10` and `FROM python:3.10` in a Dockerfile, a
`python-version` matrix under `.github/workflows`, `conda create ... python=3.10`, a `whl/cu126` index or an
`nvidia-cudnn-cu12==9.x` pin, `libnccl2=2.21...` from apt, and the env blocks of Slurm, Ray or Kubernetes.
Also the PEP 440 subset the scanner needs to read version specifiers (`admits`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pt215.upgrade_rules import (
    ACC_POLICIES,
    CUDNN_215,
    FR_LEGACY,
    FR_MISSING,
    NCCL_215,
    NCCL_GATES,
    NO_WEIGHTS_ONLY,
    UNREAD_215,
    USE_NCCL2,
    Finding,
    finding,
)

__all__ = ["ENV_RE", "LEGACY_BACKEND_RE", "TARGET_RE", "TextResult", "admits", "below_215", "oldest_python",
           "env_finding", "requirement_hits", "scan_patterns"]

ENV_NAMES = {**{k: "PT1501" for k in FR_LEGACY}, FR_MISSING: "PT1502", USE_NCCL2: "PT1503",
             NO_WEIGHTS_ONLY: "PT1510", **{k: "PT1514" for k in UNREAD_215}}
ENV_RE = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(map(re.escape, ENV_NAMES)) + r")(?![A-Za-z0-9_])")
LEGACY_BACKEND_RE = re.compile(r"(?<![\w-])nccl-legacy(?![\w-])")
TARGET_RE = re.compile(r"TORCH_TARGET_VERSION\s*[=\s]\s*\(?\s*(0[xX][0-9a-fA-F]+|\d+)")
SPEC = r"(?:===?|!=|~=|<=|>=|<|>)\s*[\w.*+!-]+(?:\s*,\s*(?:===?|!=|~=|<=|>=|<|>)\s*[\w.*+!-]+)*"
TORCH_REQ_RE = re.compile(r"(?<![\w.-])torch\s*(?:\[[^\]]*\])?\s*(" + SPEC + ")")
CONDA_TORCH_RE = re.compile(r"^\s*-\s*[\"']?(?:pytorch|torch)\s*=\s*([\d][\w.*]*)")
CONDA_PY_RE = re.compile(r"^\s*-\s*[\"']?python\s*(=|==|<=|>=|<|>|~=)?\s*(\d+\.\d+)")
# A Python version in a Docker base image or tag: python:3.10-slim, ...-py3.10-..., -py310-
DOCKER_FROM_RE = re.compile(r"^\s*FROM\s+(\S+)", re.IGNORECASE)
IMAGE_PY_RE = re.compile(r"(?:^|[/:])python:(3\.\d+)|[-_:.]py(3)\.?(\d{1,2})(?![\d.])")
DOCKER_ENV_PY_RE = re.compile(r"^\s*(?:ENV|ARG)\s+(?:\S+=\S*\s+)*(PYTHON_VERSION|PY_VERSION|PYTHON)[= ]\s*"
                              r"[\"']?(3\.\d+)", re.IGNORECASE)
INSTALL_PY_RE = re.compile(r"(?:conda|mamba|micromamba)\s+(?:create|install)\b[^#\n]*?\bpython\s*=\s*[\"']?(3\.\d+)"
                           r"|uv\s+(?:venv|python\s+install)\b[^#\n]*?(?:--python\s+|\s)(3\.\d+)"
                           r"|pyenv\s+(?:install|global|local)\s+(3\.\d+)"
                           r"|apt(?:-get)?\s+install\b[^#\n]*?\bpython(3\.\d+)\b")
CI_PY_KEY_RE = re.compile(r"""^\s*-?\s*["']?(python-version|python_version|python)["']?\s*:\s*(.*)$""")
CI_IMAGE_RE = re.compile(r"""^\s*-?\s*image\s*:\s*["']?(\S+?)["']?\s*$""")
CU12_INDEX_RE = re.compile(r"download\.pytorch\.org/whl/(?:nightly/|test/)?(cu1[0-2]\d)(?!\d)")
CU12_LIB_RE = re.compile(r"(?<![\w-])(nvidia-[a-z0-9-]+-cu1[12])(?![\w-])(\s*(?:===?|~=|>=|<=|<|>|!=))?")
INSTALL_RE = re.compile(r"\b(?:pip3?|uv\s+pip|conda|mamba)\s+install\b|\buv\s+add\b")
#: A CI workflow whose Python version matters for torch: it names torch or installs the project.
CI_INSTALLS_TORCH_RE = re.compile(r"\btorch\b|download\.pytorch\.org|uv\s+sync|poetry\s+install"
                                  r"|pip3?\s+install(?![^\n]*--no-deps)[^\n]*?(?:\s-e\s*\.|\s\.(?:\[|\s|$)|[\"']\.\[)",
                                  re.MULTILINE)
CU12_LOCAL_RE = re.compile(r"(?<![\w.-])torch(?:vision|audio)?\s*==\s*[\d.]+\+(cu1[0-2]\d)(?!\d)")
NCCL_PIP_RE = re.compile(r"(?<![\w-])nvidia-nccl-cu1\d\s*==\s*(\d+\.\d+(?:\.\d+)?)")
NCCL_APT_RE = re.compile(r"(?<![\w-])libnccl(?:2|-dev)\s*=\s*(\d+\.\d+\.\d+)")
CUDNN_PIP_RE = re.compile(r"(?<![\w-])nvidia-cudnn-cu1\d\s*==\s*(\d+\.\d+(?:\.\d+)*)")
CUDNN_APT_RE = re.compile(r"(?<![\w-])libcudnn\d(?:-dev)?(?:-cuda-\d+)?\s*=\s*(\d+\.\d+\.\d+)")
FP32_VALUES = {"fp32", "float32", "float", "torch.float32", "torch.float", "32"}
NOQA_RE = re.compile(r"#\s*noqa(?::\s*([A-Z]+\d+(?:[\s,]+[A-Z]+\d+)*))?", re.IGNORECASE)


@dataclass
class TextResult:
    findings: list[Finding] = field(default_factory=list)
    pins: list[tuple[int, str]] = field(default_factory=list)
    edits: list[tuple[str, int, str]] = field(default_factory=list)  # (code, line, the whole new line)


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


# ---------------------------------------------------------------- shared line checks


def env_finding(path: str, line: int, name: str, fr_new: set[str] | frozenset[str] = frozenset()) -> Finding | None:
    """The finding for an environment variable name, or None for a legacy FR name already paired with its
    TORCH_FR_* name in the same file (the advice of PT1501, followed)."""
    code = ENV_NAMES[name]
    if code == "PT1501":
        if FR_LEGACY[name] in fr_new:
            return None
        return finding(path, line, code, name=name, new=FR_LEGACY[name])
    if code == "PT1510":
        return finding(path, line, code, what=f"{name}=1 makes every torch.load without weights_only= that")
    if code == "PT1514":
        return finding(path, line, code, name=name, why=UNREAD_215[name])
    return finding(path, line, code)


def _gates_missed(v: tuple[int, ...]) -> list[str]:
    return [what for need, what in NCCL_GATES if _cmp(v, need) < 0]


def requirement_hits(text: str) -> list[tuple[int, str, dict[str, object]]]:
    """CUDA 12 wheels and libraries, NCCL and cuDNN below 2.15's gates, in any text: (offset, code, fmt)."""
    out: list[tuple[int, str, dict[str, object]]] = []
    for m in CU12_INDEX_RE.finditer(text):
        out.append((m.start(), "PT1512", {"what": f"the wheel index whl/{m.group(1)}"}))
    for m in CU12_LIB_RE.finditer(text):
        line_start = text.rfind("\n", 0, m.start()) + 1
        line_end = text.find("\n", m.end())
        line = text[line_start: line_end if line_end >= 0 else len(text)]
        if m.group(2) or (INSTALL_RE.search(line) and "uninstall" not in line):
            out.append((m.start(), "PT1512", {"what": m.group(1)}))
    for m in CU12_LOCAL_RE.finditer(text):
        out.append((m.start(), "PT1512", {"what": f"the +{m.group(1)} wheel"}))
    for rx, what in ((NCCL_PIP_RE, "NCCL (nvidia-nccl pin)"), (NCCL_APT_RE, "NCCL (system libnccl)")):
        for m in rx.finditer(text):
            v = _vtuple(m.group(1))
            missed = _gates_missed(v)
            if missed:
                out.append((m.start(), "PT1513", {
                    "what": what, "version": m.group(1), "gate": "2.29.7, the newest gate of 2.15's NCCL2",
                    "fix": "2.15's NCCL2 needs it for " + ", ".join(missed) + "; the 2.15 wheel brings "
                           f"nvidia-nccl-cu13=={'.'.join(map(str, NCCL_215))}: drop the pin, or make sure this "
                           "copy is not the one torch loads (LD_LIBRARY_PATH)"}))
    for rx, what in ((CUDNN_PIP_RE, "cuDNN (nvidia-cudnn pin)"), (CUDNN_APT_RE, "cuDNN (system libcudnn)")):
        for m in rx.finditer(text):
            if _cmp(_vtuple(m.group(1))[:2], CUDNN_215) < 0:
                out.append((m.start(), "PT1513", {
                    "what": what, "version": m.group(1), "gate": "9.26, what the 2.15 wheel requires",
                    "fix": "the 2.15 CUDA wheel requires nvidia-cudnn-cu13==9.26.0.51: pip cannot install both, "
                           "and an older system cuDNN first on the library path shadows it"}))
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


def _python_values(text: str) -> list[str]:
    return re.findall(r"(?<![\d.])(3\.\d{1,2})(?![\d])", text)


def _old(version: str) -> bool:
    return _cmp(_vtuple(version), (3, 11)) < 0


def scan_patterns(text: str, path: str, kind: str, *, ci: bool = False) -> TextResult:
    """Scan a non-Python file line by line. `ci`: the file is a CI workflow (GitHub, GitLab), where a
    `python-version` key or matrix names the interpreters the job installs torch on."""
    res = TextResult()
    lines = text.splitlines()
    fr_new = set(re.findall(r"TORCH_FR_[A-Z_]+", text))
    section = ""
    py_list_indent: int | None = None
    ci_skip = ci and not CI_INSTALLS_TORCH_RE.search(text)  # a workflow that installs no torch: its Python is moot

    def add(n: int, code: str, **fmt: object) -> None:
        res.findings.append(finding(path, n, code, **fmt))

    for n, raw in enumerate(lines, 1):
        line = _strip_comment(raw, kind)
        if not line.strip():
            continue
        if kind in ("toml", "ini") and re.match(r"\s*\[", line):
            section = line.strip()
        for m in ENV_RE.finditer(line):
            f = env_finding(path, n, m.group(1), fr_new)
            if f:
                res.findings.append(f)
        if LEGACY_BACKEND_RE.search(line):
            add(n, "PT1504")
        for m in TARGET_RE.finditer(line):
            v = int(m.group(1), 0) if re.fullmatch(r"0[xX][0-9a-fA-F]+|\d+", m.group(1)) else 0
            if (v >> 56, (v >> 48) & 0xFF) > (2, 15):
                add(n, "PT1511", value=m.group(1), target=f"{v >> 56}.{(v >> 48) & 0xFF}")
        for _, code, fmt in requirement_hits(line):
            add(n, code, **fmt)
        m = re.match(r"""\s*-?\s*["']?acc_policy["']?\s*[:=]\s*["']?([\w-]+)""", line)
        if m and m.group(1) not in ACC_POLICIES:
            add(n, "PT1506", value=m.group(1))
        # FSDP2 mixed precision in a config: param_dtype set (not fp32), reduce_dtype missing or null
        m = re.match(r"""\s*["']?param_dtype["']?\s*[:=]\s*["']?([\w.]+)""", line)
        if m and kind in ("yaml", "toml", "ini") and m.group(1).lower() not in {"null", "none", "~"} | FP32_VALUES:
            red = [s for s in _block(lines, n - 1, kind) if re.match(r"""["']?reduce_dtype["']?\s*[:=]""", s)]
            if not red:
                add(n, "PT1505", param=m.group(1), how="no reduce_dtype")
            elif re.search(r"[:=]\s*[\"']?(null|None|none|~)?[\"']?\s*$", red[0]):
                add(n, "PT1505", param=m.group(1), how="reduce_dtype=None")
        _python_checks(res, lines, n, line, kind, section, ci, add)
        if (ci or kind == "yaml") and not ci_skip:
            py_list_indent = _ci_python(line, n, py_list_indent, ci, add)
        # torch pins: requirement strings anywhere, conda, Poetry tables
        for m in TORCH_REQ_RE.finditer(line):
            res.pins.append((n, m.group(1)))
        if kind == "yaml":
            m = CONDA_TORCH_RE.match(line)
            if m:
                res.pins.append((n, f"=={m.group(1)}" if "*" in m.group(1) else f"=={m.group(1)}.*"))
        m = re.match(r"""\s*torch\s*=\s*(?:["']([^"']+)["']|\{[^}]*version\s*=\s*["']([^"']+)["'])""", line)
        if m and kind == "toml":
            spec = m.group(1) or m.group(2)
            res.pins.append((n, spec if re.match(r"\s*[<>=!~^]", spec) else f"=={spec}"))
        if re.search(r"(?<![\w.])torch\.load\(.*weights_only\s*=\s*False", line):
            add(n, "PT1510", what="torch.load(..., weights_only=False)")
    return res


def _python_checks(res: TextResult, lines: list[str], n: int, line: str, kind: str, section: str, ci: bool,
                   add) -> None:  # noqa: ANN001 - the closure of scan_patterns
    m = re.match(r"""(\s*)(requires-python|python_requires|python)(\s*=\s*)(["']?)([^"'#]+?)(["']?)\s*$""", line)
    if m and (m.group(2) != "python" or "poetry" in section) and kind in ("toml", "ini"):
        low = oldest_python(m.group(5))
        if low:
            add(n, "PT1508", what=f"{m.group(2)} {m.group(5).strip()!r}", low=low)
            if re.fullmatch(r"\s*>=\s*3(\.\d+)*\s*", m.group(5)):
                raw = lines[n - 1]
                res.edits.append(("PT1508", n, raw.replace(m.group(5), ">=3.11", 1)))
    if kind == "yaml":
        m = CONDA_PY_RE.match(line)
        if m and not ci:
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
    m = INSTALL_PY_RE.search(line)
    if m:
        ver = next(g for g in m.groups() if g)
        if _old(ver):
            add(n, "PT1508", what=f"the interpreter installed here (python {ver})", low=ver)


def _ci_python(line: str, n: int, list_indent: int | None, ci: bool, add) -> int | None:  # noqa: ANN001
    """`python-version: [...]`, `python-version: "3.10"`, a YAML list under `python-version:`, and a CI job's
    `image: python:3.10`. Returns the indentation of an open list under python-version, or None."""
    indent = len(line) - len(line.lstrip())
    if list_indent is not None:
        item = re.match(r"""\s*-\s*["']?(3\.\d+)["']?\s*$""", line)
        if item and indent >= list_indent:
            if _old(item.group(1)):
                add(n, "PT1508", what=f"the CI matrix's python-version {item.group(1)}", low=item.group(1))
            return list_indent
        list_indent = None
    m = CI_PY_KEY_RE.match(line)
    if m and (ci or m.group(1) != "python"):
        value = m.group(2).strip()
        if not value:
            return indent
        olds = [v for v in _python_values(value) if _old(v)]
        if olds and (ci or m.group(1) == "python-version"):
            add(n, "PT1508", what=f"the CI's {m.group(1)} {', '.join(olds)}", low=olds[-1])
    if ci:
        m = CI_IMAGE_RE.match(line)
        if m:
            im = IMAGE_PY_RE.search(m.group(1))
            ver = (im.group(1) or f"{im.group(2)}.{im.group(3)}") if im else None
            if ver and _old(ver):
                add(n, "PT1508", what=f"the CI image {m.group(1)}", low=ver)
    return list_indent
