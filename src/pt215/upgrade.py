"""`python -m pt215.upgrade PATH...`: find what PyTorch 2.15 changes in a team's code and configs (chapter 7).

A linter for one upgrade. It reads Python with the `ast` module (so `os.environ["X"] = ...`,
`os.environ.setdefault`, `os.putenv`, `env=dict(os.environ, X=...)`, keyword arguments and calls are
recognised whatever the formatting) and shell scripts, Dockerfiles, YAML, TOML, INI/`setup.cfg` and
requirements files by pattern. It prints one finding per line, `path:line: CODE message`, never modifies a
file, and exits 1 when it found something, 0 when not, 2 on bad input.

Codes (stable; chapter 7 explains each, the message names the book section):

======  ==========================================================================================
PT1501  legacy flight-recorder variable (`TORCH_NCCL_TRACE_BUFFER_SIZE`, ...): use its `TORCH_FR_*` name
PT1502  `TORCH_NCCL_ENABLE_FLIGHT_RECORDER`: no such variable; the recorder is on when its buffer size > 0
PT1503  `TORCH_DIST_USE_NCCL2`: only "0" does anything (the legacy backend, a rollback path)
PT1504  `"nccl-legacy"` backend name: the pre-2.15 `ProcessGroupNCCL`, a rollback path
PT1505  `MixedPrecisionPolicy(param_dtype=...)` with `reduce_dtype` None or absent: 2.15 reduces in fp32
PT1506  `acc_policy` value that `LinearCrossEntropyOptions` does not accept
PT1507  DCP save: checkpoints written by 2.15 cannot be read by 2.14 or older
PT1508  `requires-python` / `python_requires` / a Python pin admitting 3.10 or older (2.15 needs >= 3.11)
PT1509  torch pinned below 2.15 while the scanned code uses an API the book shows is new in 2.15
PT1510  `torch.load(..., weights_only=False)` or `TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`
PT1511  `TORCH_TARGET_VERSION` newer than the 2.15 libtorch headers (a compile error)
======  ==========================================================================================

Directories are walked recursively; `.venv`, `venv`, `_build`, `build`, `node_modules`, `__pycache__`,
`site-packages` and hidden directories (`.git`, ...) are skipped unless named on the command line.
A finding is silenced by `# noqa: PT1505` (the code, explicitly) on its line.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

__all__ = ["RULES", "Rule", "Finding", "ScanError", "FR_LEGACY", "ACC_POLICIES", "scan_text", "scan_file",
           "scan_paths", "iter_files", "admits", "main"]


@dataclass(frozen=True)
class Rule:
    """One code: what it finds, the fix, and the book section that explains it (label, title)."""

    code: str
    title: str
    fix: str
    label: str
    section: str
    summary: str = ""


SUMMARIES = {
    "PT1501": "legacy flight-recorder variable name",
    "PT1502": "TORCH_NCCL_ENABLE_FLIGHT_RECORDER (never existed)",
    "PT1503": "TORCH_DIST_USE_NCCL2 (legacy backend switch)",
    "PT1504": "\"nccl-legacy\" backend name",
    "PT1505": "MixedPrecisionPolicy without reduce_dtype",
    "PT1506": "acc_policy value that does not exist",
    "PT1507": "DCP save: readers must be on 2.15",
    "PT1508": "Python requirement admitting 3.10 or older",
    "PT1509": "torch pinned below 2.15 next to a 2.15 API",
    "PT1510": "torch.load(weights_only=False)",
    "PT1511": "TORCH_TARGET_VERSION newer than 2.15",
}

RULES: dict[str, Rule] = {r.code: r for r in [
    Rule("PT1501", "legacy flight-recorder variable", "rename it to {new}", "fr-settings",
         "chapter 2, The settings"),
    Rule("PT1502", "TORCH_NCCL_ENABLE_FLIGHT_RECORDER does not exist",
         "delete it; the recorder is on whenever TORCH_FR_BUFFER_SIZE > 0 (default 2000)", "fr-settings",
         "chapter 2, The settings"),
    Rule("PT1503", "TORCH_DIST_USE_NCCL2 is the switch back to the legacy NCCL backend",
         "only the exact string \"0\" has an effect (legacy ProcessGroupNCCL, planned for removal): A/B the job "
         "on nccl and delete the variable", "nccl2-migration", "chapter 1, Migration plan"),
    Rule("PT1504", "\"nccl-legacy\" builds the pre-2.15 ProcessGroupNCCL",
         "use \"nccl\" (ProcessGroupNCCL2); keep nccl-legacy only in a labelled comparison job",
         "nccl2-migration", "chapter 1, Migration plan"),
    Rule("PT1505", "MixedPrecisionPolicy sets param_dtype and {how}",
         "2.15 reduces gradients in each parameter's grad_dtype (fp32 for fp32 parameters), 2x the bytes of "
         "2.14's param_dtype reduction: set reduce_dtype explicitly (torch.bfloat16 keeps 2.14's behaviour)",
         "upgrade-reduce-dtype", "chapter 7, FSDP2 reduce_dtype"),
    Rule("PT1506", "acc_policy={value!r} does not exist",
         "use one of 'auto', 'accurate', 'compact' (LinearCrossEntropyOptions raises ValueError otherwise)",
         "upgrade-acc-policy", "chapter 7, acc_policy"),
    Rule("PT1507", "DCP save: readers must be on 2.15",
         "2.15 records tensor strides in .metadata, which 2.14 and older cannot unpickle: upgrade every reader "
         "(evaluation, export, conversion) with the writers", "upgrade-dcp", "chapter 7, DCP checkpoints"),
    Rule("PT1508", "{what} admits Python {low}",
         "2.15 ships wheels for Python 3.11-3.15 only: require >=3.11", "upgrade-python",
         "chapter 7, Python and wheels"),
    Rule("PT1509", "torch pinned below 2.15 ({spec}) but {use} uses {api}, new in 2.15",
         "pin torch>=2.15 (or drop the 2.15-only call)", "upgrade-pins", "chapter 7, Pins"),
    Rule("PT1510", "{what} unpickles arbitrary code",
         "load with weights_only=True (the default) and allow your own classes with "
         "torch.serialization.add_safe_globals([...])", "upgrade-torch-load", "chapter 7, torch.load"),
    Rule("PT1511", "TORCH_TARGET_VERSION {value} targets torch {target}, newer than the 2.15 headers",
         "lower it to <= 0x020f000000000000 (2.15) or build against a newer torch; a larger value is a "
         "compile error", "upgrade-cpp", "chapter 7, C++ extensions"),
]}
RULES = {code: replace(rule, summary=SUMMARIES[code]) for code, rule in RULES.items()}

#: Flight-recorder variables renamed in 2.15: legacy name -> new name (`FlightRecorder.hpp`, `libtorch_cpu.so`).
FR_LEGACY: dict[str, str] = {
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "TORCH_FR_BUFFER_SIZE",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "TORCH_FR_DUMP_ON_TIMEOUT",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "TORCH_FR_DUMP_TEMP_FILE",
    "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "TORCH_FR_WAIT_TIMEOUT_DUMP_MILSEC",
    "TORCH_NCCL_TRACE_CPP_STACK": "TORCH_FR_CPP_STACK",
}
FR_MISSING = "TORCH_NCCL_ENABLE_FLIGHT_RECORDER"
USE_NCCL2 = "TORCH_DIST_USE_NCCL2"
NO_WEIGHTS_ONLY = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
#: `torch.nn.modules.linear_cross_entropy_options._VALID_ACC_POLICIES` in 2.15.0 (a test checks they agree).
ACC_POLICIES = ("auto", "accurate", "compact")
#: APIs the book shows are new in 2.15 (chapters 1, 3, 4 and 7): evidence for PT1509.
NEW_IN_215 = ("param_dtype_override_fn", "LinearCrossEntropyOptions", "LinearCrossEntropyLoss",
              "linear_cross_entropy", "enable_reconfigure", "_reconfigure", "_get_reconfigure_handle",
              "torch.distributed._transport")
DCP_SAVES = {"torch.distributed.checkpoint.save", "torch.distributed.checkpoint.async_save",
             "torch.distributed.checkpoint.save_state_dict", "torch.distributed.checkpoint.state_dict_saver.save",
             "torch.distributed.checkpoint.state_dict_saver.async_save"}
ENV_NAMES = {**{k: "PT1501" for k in FR_LEGACY}, FR_MISSING: "PT1502", USE_NCCL2: "PT1503",
             NO_WEIGHTS_ONLY: "PT1510"}
ENV_RE = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(map(re.escape, ENV_NAMES)) + r")(?![A-Za-z0-9_])")
LEGACY_BACKEND_RE = re.compile(r"(?<![\w-])nccl-legacy(?![\w-])")
FR_NEW_RE = re.compile(r"(?<![A-Za-z0-9_])TORCH_FR_[A-Z_]+")
TARGET_RE = re.compile(r"TORCH_TARGET_VERSION\s*[=\s]\s*\(?\s*(0[xX][0-9a-fA-F]+|\d+)")
NOQA_RE = re.compile(r"#\s*noqa:\s*([A-Z0-9, ]+)")
SPEC = r"(?:===?|!=|~=|<=|>=|<|>)\s*[\w.*+!-]+(?:\s*,\s*(?:===?|!=|~=|<=|>=|<|>)\s*[\w.*+!-]+)*"
TORCH_REQ_RE = re.compile(r"(?<![\w.-])torch\s*(?:\[[^\]]*\])?\s*(" + SPEC + ")")
CONDA_TORCH_RE = re.compile(r"^\s*-\s*[\"']?(?:pytorch|torch)\s*=\s*([\d][\w.*]*)")
CONDA_PY_RE = re.compile(r"^\s*-\s*[\"']?python\s*(=|==|<=|>=|<|>|~=)?\s*(\d+\.\d+)")
DOCKER_PY_RE = re.compile(r"^\s*FROM\s+(?:\S+/)?python:(\d+\.\d+)", re.IGNORECASE)

SKIP_DIRS = {".venv", "venv", "_build", "build", "node_modules", "__pycache__", "site-packages"}
SHELL_SUFFIXES = {".sh", ".bash", ".zsh", ".ksh", ".slurm", ".sbatch", ".env"}
KINDS = {".py": "python", ".yaml": "yaml", ".yml": "yaml", ".toml": "toml", ".ini": "ini", ".cfg": "ini",
         **{s: "shell" for s in SHELL_SUFFIXES}}


@dataclass(frozen=True)
class Finding:
    """One finding: where, which code, and a message that includes the fix and the book section."""

    path: str
    line: int
    code: str
    message: str
    fix: str
    section: str
    label: str

    def text(self) -> str:
        """`path:line: CODE message: fix (book: section)`, the linter line."""
        return f"{self.path}:{self.line}: {self.code} {self.message}: {self.fix} (book: {self.section})"

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class ScanError(Exception):
    """Bad input: a path that does not exist, cannot be read, or is not UTF-8 text. The message names it."""


def _finding(path: str, line: int, code: str, **fmt: object) -> Finding:
    rule = RULES[code]
    return Finding(path, line, code, rule.title.format(**fmt), rule.fix.format(**fmt), rule.section, rule.label)


def _env_finding(path: str, line: int, name: str) -> Finding:
    code = ENV_NAMES[name]
    if code == "PT1501":
        return Finding(path, line, code, f"{name} is the legacy flight-recorder name",
                       f"rename it to {FR_LEGACY[name]} (the legacy name still works and logs a deprecation "
                       "warning; the TORCH_FR_ name wins when both are set)", RULES[code].section, RULES[code].label)
    if code == "PT1510":
        return _finding(path, line, code, what=f"{name}=1 makes every torch.load without weights_only= that")
    return _finding(path, line, code)


# ---------------------------------------------------------------- version specifiers (PEP 440 subset)


def _vtuple(text: str) -> tuple[int, ...]:
    text = text.split("+")[0]
    m = re.match(r"v?(\d+(?:\.\d+)*)", text.strip())
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
        upper = v[: nz] + (v[nz] + 1,)
        return c >= 0 and _cmp(version, upper) < 0
    if op == "~":  # Poetry tilde: >= v, < next minor (or next major when only a major is given)
        upper = (v[0] + 1,) if len(v) == 1 else (v[0], v[1] + 1)
        return c >= 0 and _cmp(version, upper) < 0
    return {"==": c == 0, "===": c == 0, "!=": c != 0, "<=": c <= 0, ">=": c >= 0, "<": c < 0, ">": c > 0}[op]


def admits(spec: str, version: str | tuple[int, ...]) -> bool:
    """Does a specifier (`>=3.9`, `>=2.4,<2.15`, `^3.10`, `3.10.*`, Poetry `a || b`) admit `version`?"""
    v = _vtuple(version) if isinstance(version, str) else version
    return any(all(_clause(v, c) for c in alt.split(",") if c.strip())
               for alt in spec.split("||"))


_OLD_PYTHONS = [(3, m, p) for m in range(0, 11) for p in (0, 99)]
_TORCH_215_PLUS = [(2, 15, 0), (2, 15, 9), (2, 16, 0), (2, 30, 0), (3, 0, 0)]


def _oldest_python(spec: str) -> str | None:
    try:
        hits = [v for v in _OLD_PYTHONS if admits(spec, v)]
    except ValueError:
        return None
    return f"{hits[-1][0]}.{hits[-1][1]}" if hits else None


def _below_215(spec: str) -> bool:
    try:
        versions = [_vtuple(v) for v in re.findall(r"\d+(?:\.\d+)*", spec)]
        older = [v for v in versions if _cmp(v, (2, 15)) < 0] + [(2, m, p) for m in range(15) for p in (0, 1, 2, 9)]
        return not any(admits(spec, v) for v in _TORCH_215_PLUS) and any(admits(spec, v) for v in older)
    except ValueError:
        return False


# ---------------------------------------------------------------- Python, by ast


class _PyScan(ast.NodeVisitor):
    def __init__(self, path: str):
        self.path = path
        self.alias: dict[str, str] = {}
        self.findings: list[Finding] = []
        self.pins: list[tuple[int, str]] = []
        self.uses: list[tuple[int, str]] = []
        self.docstrings: set[int] = set()

    def add(self, line: int, code: str, **fmt: object) -> None:
        self.findings.append(_finding(self.path, line, code, **fmt))

    def qualname(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return self.alias.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = self.qualname(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if a.asname:
                self.alias[a.asname] = a.name
            if a.name.startswith("torch.distributed._transport"):
                self.uses.append((node.lineno, "torch.distributed._transport"))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        mod = node.module or ""
        for a in node.names:
            full = f"{mod}.{a.name}" if mod else a.name
            self.alias[a.asname or a.name] = full
            if full.startswith("torch.distributed._transport") or a.name in NEW_IN_215:
                self.uses.append((node.lineno, a.name if a.name in NEW_IN_215 else "torch.distributed._transport"))

    def _body_docstrings(self, body: list[ast.stmt]) -> None:
        for st in body:
            if isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant) and isinstance(st.value.value, str):
                self.docstrings.add(id(st.value))

    def generic_visit(self, node: ast.AST) -> None:
        body = getattr(node, "body", None)
        if isinstance(body, list):
            self._body_docstrings(body)
        super().generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if not isinstance(node.value, str) or id(node) in self.docstrings:
            return
        text = node.value
        for m in ENV_RE.finditer(text):
            self.findings.append(_env_finding(self.path, node.lineno + text.count("\n", 0, m.start()), m.group(1)))
        for m in LEGACY_BACKEND_RE.finditer(text):
            self.add(node.lineno + text.count("\n", 0, m.start()), "PT1504")
        if FR_NEW_RE.search(text):
            self.uses.append((node.lineno, FR_NEW_RE.search(text).group(0)))  # type: ignore[union-attr]
        if text.strip() in ("nccl2", "nccl-lazy"):
            self.uses.append((node.lineno, f'backend "{text.strip()}"'))
        m = re.fullmatch(r"\s*torch\s*(?:\[[^\]]*\])?\s*(" + SPEC + r")\s*", text)
        if m:
            self.pins.append((node.lineno, m.group(1)))
        for m in TARGET_RE.finditer(text):
            self._target(node.lineno, m.group(1))

    def _target(self, line: int, value: str) -> None:
        _check_target(self.findings, self.path, line, value)

    def visit_keyword(self, node: ast.keyword) -> None:
        if node.arg in ENV_NAMES:
            self.findings.append(_env_finding(self.path, node.value.lineno, node.arg))
        if node.arg and FR_NEW_RE.fullmatch(node.arg):
            self.uses.append((node.value.lineno, node.arg))
        if node.arg in ("param_dtype_override_fn", "enable_reconfigure"):
            self.uses.append((node.value.lineno, node.arg))
        if node.arg == "acc_policy":
            self._acc_policy(node.value)
        if node.arg == "python_requires" and isinstance(node.value, ast.Constant) and isinstance(
                node.value.value, str):
            low = _oldest_python(node.value.value)
            if low:
                self.add(node.value.lineno, "PT1508", what=f"python_requires={node.value.value!r}", low=low)
        self.generic_visit(node)

    def _acc_policy(self, value: ast.AST) -> None:
        if isinstance(value, ast.Constant) and isinstance(value.value, str) and value.value not in ACC_POLICIES:
            self.add(value.lineno, "PT1506", value=value.value)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in NEW_IN_215:
            self.uses.append((node.lineno, node.attr))
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in NEW_IN_215:
            self.uses.append((node.lineno, node.id))

    def visit_Call(self, node: ast.Call) -> None:
        name = self.qualname(node.func) or ""
        last = name.rsplit(".", 1)[-1]
        kw = {k.arg: k.value for k in node.keywords}
        if last == "MixedPrecisionPolicy" and None not in kw:  # no **kwargs: the call says it all
            param = kw.get("param_dtype", node.args[0] if node.args else None)
            reduce = kw.get("reduce_dtype", node.args[1] if len(node.args) > 1 else None)
            param_set = param is not None and not (isinstance(param, ast.Constant) and param.value is None)
            if param_set and reduce is None:
                self.add(node.lineno, "PT1505", how="no reduce_dtype")
            elif param_set and isinstance(reduce, ast.Constant) and reduce.value is None:
                self.add(reduce.lineno, "PT1505", how="reduce_dtype=None")
        if last == "LinearCrossEntropyOptions" and len(node.args) > 3:
            self._acc_policy(node.args[3])
        if name in DCP_SAVES or (name.split(".")[0] == "dcp" and last in ("save", "async_save")):
            self.add(node.lineno, "PT1507")
        if name == "torch.load" or (last == "load" and name.endswith("serialization.load")):
            wo = kw.get("weights_only")
            if isinstance(wo, ast.Constant) and wo.value is False:
                self.add(wo.lineno, "PT1510", what="torch.load(..., weights_only=False)")
        self.generic_visit(node)


def _check_target(out: list[Finding], path: str, line: int, value: str) -> None:
    try:
        v = int(value, 0)
    except ValueError:
        return
    major, minor = v >> 56, (v >> 48) & 0xFF
    if (major, minor) > (2, 15):
        out.append(_finding(path, line, "PT1511", value=value, target=f"{major}.{minor}"))


def _scan_python(text: str, path: str) -> tuple[list[Finding], list[tuple[int, str]], list[tuple[int, str]]]:
    tree = ast.parse(text, filename=path)
    v = _PyScan(path)
    if isinstance(tree, ast.Module):
        v._body_docstrings(tree.body)
    v.visit(tree)
    return v.findings, v.pins, v.uses


# ---------------------------------------------------------------- everything else, by pattern


def _strip_comment(line: str, kind: str) -> str:
    if kind == "ini" and line.lstrip().startswith(";"):
        return ""
    if line.lstrip().startswith("#"):
        return ""
    m = re.search(r"\s#", line)
    return line[: m.start()] if m else line


def _yaml_siblings(lines: list[str], i: int) -> list[str]:
    """Lines at the same indentation as line i inside its YAML block."""
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


def _scan_patterns(text: str, path: str, kind: str) -> tuple[list[Finding], list[tuple[int, str]],
                                                             list[tuple[int, str]]]:
    findings: list[Finding] = []
    pins: list[tuple[int, str]] = []
    uses: list[tuple[int, str]] = []
    lines = text.splitlines()
    section = ""
    for n, raw in enumerate(lines, 1):
        line = _strip_comment(raw, kind)
        if not line.strip():
            continue
        if kind in ("toml", "ini") and re.match(r"\s*\[", line):
            section = line.strip()
        for m in ENV_RE.finditer(line):
            findings.append(_env_finding(path, n, m.group(1)))
        if LEGACY_BACKEND_RE.search(line):
            findings.append(_finding(path, n, "PT1504"))
        m = FR_NEW_RE.search(line)
        if m:
            uses.append((n, m.group(0)))
        for m in TARGET_RE.finditer(line):
            _check_target(findings, path, n, m.group(1))
        # acc_policy: balanced / acc_policy = "fast"
        m = re.match(r"""\s*-?\s*["']?acc_policy["']?\s*[:=]\s*["']?([\w-]+)""", line)
        if m and m.group(1) not in ACC_POLICIES:
            findings.append(_finding(path, n, "PT1506", value=m.group(1)))
        # FSDP2 mixed precision in a config: param_dtype set, reduce_dtype missing or null in the same block
        m = re.match(r"""\s*["']?param_dtype["']?\s*[:=]\s*["']?([\w.]+)""", line)
        if m and m.group(1).lower() not in ("null", "none", "~"):
            if kind == "yaml":
                sib = _yaml_siblings(lines, n - 1)
            else:
                sib = _section_lines(lines, n - 1)
            red = [s for s in sib if re.match(r"""["']?reduce_dtype["']?\s*[:=]""", s)]
            if not red:
                findings.append(_finding(path, n, "PT1505", how="no reduce_dtype"))
            elif re.search(r"[:=]\s*[\"']?(null|None|none|~)?[\"']?\s*$", red[0]):
                findings.append(_finding(path, n, "PT1505", how="reduce_dtype=None"))
        # Python version requirements
        m = re.match(r"""\s*(requires-python|python_requires|python)\s*=\s*["']?([^"'#]+?)["']?\s*$""", line)
        if m and (m.group(1) != "python" or "poetry" in section) and kind in ("toml", "ini"):
            low = _oldest_python(m.group(2))
            if low:
                findings.append(_finding(path, n, "PT1508", what=f"{m.group(1)} {m.group(2).strip()!r}", low=low))
        if kind == "yaml":
            m = CONDA_PY_RE.match(line)
            if m:
                spec = f"{m.group(1) or '=='}{m.group(2)}" if m.group(1) not in (None, "=") else f"=={m.group(2)}.*"
                low = _oldest_python(spec)
                if low:
                    findings.append(_finding(path, n, "PT1508", what=f"the environment's python {m.group(2)}",
                                             low=low))
            m = CONDA_TORCH_RE.match(line)
            if m:
                pins.append((n, f"=={m.group(1)}" if "*" in m.group(1) else f"=={m.group(1)}.*"))
        if kind == "dockerfile":
            m = DOCKER_PY_RE.match(line)
            if m and _oldest_python(f"=={m.group(1)}.*"):
                findings.append(_finding(path, n, "PT1508", what=f"the base image python:{m.group(1)}",
                                         low=m.group(1)))
        # torch pins: requirement strings anywhere, Poetry tables
        for m in TORCH_REQ_RE.finditer(line):
            pins.append((n, m.group(1)))
        m = re.match(r"""\s*torch\s*=\s*(?:["']([^"']+)["']|\{[^}]*version\s*=\s*["']([^"']+)["'])""", line)
        if m and kind == "toml":
            spec = m.group(1) or m.group(2)
            pins.append((n, spec if re.match(r"\s*[<>=!~^]", spec) else f"=={spec}"))
        if re.search(r"(?<![\w.])torch\.load\(.*weights_only\s*=\s*False", line):
            findings.append(_finding(path, n, "PT1510", what="torch.load(..., weights_only=False)"))
        for name in ("param_dtype_override_fn", "LinearCrossEntropyOptions", "enable_reconfigure"):
            if name in line:
                uses.append((n, name))
    return findings, pins, uses


def _section_lines(lines: list[str], i: int) -> list[str]:
    """The stripped lines of the TOML/INI section containing line i."""
    start = next((j for j in range(i, -1, -1) if re.match(r"\s*\[", lines[j])), -1)
    end = next((j for j in range(i + 1, len(lines)) if re.match(r"\s*\[", lines[j])), len(lines))
    return [s.strip() for s in lines[start + 1: end]]


# ---------------------------------------------------------------- files


def kind_of(path: Path) -> str | None:
    """The scanner's name for a file's kind, or None for files a directory walk ignores."""
    name = path.name
    if name == "Dockerfile" or name.endswith(".dockerfile") or name.startswith("Dockerfile."):
        return "dockerfile"
    if name.endswith(".txt") and ("requirements" in name or "constraints" in name):
        return "requirements"
    return KINDS.get(path.suffix.lower())


def _noqa(text: str) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for n, line in enumerate(text.splitlines(), 1):
        m = NOQA_RE.search(line)
        if m:
            out[n] = {c.strip() for c in m.group(1).split(",") if c.strip()}
    return out


def _scan_one(text: str, path: str, kind: str) -> tuple[list[Finding], list[tuple[int, str]],
                                                        list[tuple[int, str]], str | None]:
    note = None
    if kind == "python":
        try:
            found, pins, uses = _scan_python(text, path)
        except SyntaxError as e:
            note = f"{path}:{e.lineno or 0}: not valid Python ({e.msg}); scanned by pattern only"
            found, pins, uses = _scan_patterns(text, path, "shell")
    else:
        found, pins, uses = _scan_patterns(text, path, kind)
    quiet = _noqa(text)
    found = [f for f in dict.fromkeys(found) if f.code not in quiet.get(f.line, set())]  # one per line and code
    return found, pins, uses, note


def _resolve_pins(files: list[tuple[str, list[tuple[int, str]], list[tuple[int, str]]]]) -> list[Finding]:
    uses = [(p, line, api) for p, _, us in files for line, api in us]
    if not uses:
        return []
    p0, l0, api = uses[0]
    out = []
    for path, pins, _ in files:
        for line, spec in pins:
            if _below_215(spec):
                out.append(_finding(path, line, "PT1509", spec=f"torch{spec}", use=f"{p0}:{l0}", api=api))
    return out


def scan_text(text: str, path: str = "<text>", kind: str | None = None) -> list[Finding]:
    """Scan one file's text; `kind` (python, shell, dockerfile, yaml, toml, ini, requirements) defaults
    from `path`'s name, and to shell-style patterns when the name says nothing."""
    k = kind or kind_of(Path(path)) or "shell"
    found, pins, uses, _ = _scan_one(text, path, k)
    return sorted(found + _resolve_pins([(path, pins, uses)]), key=lambda f: (f.line, f.code))


def iter_files(paths: Sequence[str | Path], *, exclude: Iterable[str] = ()) -> list[Path]:
    """The files a scan of `paths` reads: named files always, directories walked (skipping SKIP_DIRS,
    `exclude` and hidden directories). Raises ScanError for a path that does not exist."""
    skip = SKIP_DIRS | set(exclude)
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            for f in sorted(p.rglob("*")):
                rel = f.relative_to(p).parts
                if any(part in skip or part.startswith(".") for part in rel[:-1]):
                    continue
                if f.is_file() and kind_of(f):
                    out.append(f)
        elif p.exists():
            raise ScanError(f"{p}: not a regular file or directory")
        else:
            raise ScanError(f"{p}: no such file or directory")
    return out


def _read(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ScanError(f"{path}: cannot read ({e.strerror or e})") from e
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ScanError(f"{path}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from e


def scan_file(path: str | Path) -> list[Finding]:
    """Scan one file (read-only). Raises ScanError if it is missing, unreadable or not UTF-8."""
    return scan_paths([path])[0]


def scan_paths(paths: Sequence[str | Path], *, exclude: Iterable[str] = ()
               ) -> tuple[list[Finding], int, list[str]]:
    """Scan files and directories; returns (findings sorted by path and line, files scanned, notes).

    Every file is read before anything is reported, so bad input raises ScanError and nothing else."""
    files = iter_files(paths, exclude=exclude)
    texts = [(str(f), _read(f), kind_of(f) or "shell") for f in files]
    found: list[Finding] = []
    per_file = []
    notes = []
    for path, text, kind in texts:
        f, pins, uses, note = _scan_one(text, path, kind)
        found += f
        per_file.append((path, pins, uses))
        if note:
            notes.append(note)
    found += _resolve_pins(per_file)
    return sorted(found, key=lambda f: (f.path, f.line, f.code)), len(files), notes


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: findings on stdout, exit 1 if any, 0 if none, 2 on bad input (message on stderr)."""
    ap = argparse.ArgumentParser(
        prog="python -m pt215.upgrade",
        description="Find what PyTorch 2.15 changes in code and configs (Python by ast; shell, Dockerfile, "
                    "YAML, TOML, INI/setup.cfg, requirements*.txt by pattern). Read-only. Exit 1 when it finds "
                    "something, 0 when not, 2 on bad input. Codes: PT1501-PT1511 (book, chapter 7).",
        epilog="Directories are walked recursively, skipping " + ", ".join(sorted(SKIP_DIRS)) +
               " and hidden directories (.git, ...) unless named explicitly. Silence one finding with "
               "`# noqa: PT15NN` on its line.")
    ap.add_argument("paths", nargs="+", metavar="PATH", help="files or directories to scan")
    ap.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")
    ap.add_argument("--exclude", action="append", default=[], metavar="NAME",
                    help="also skip directories with this name (repeatable)")
    args = ap.parse_args(argv)
    try:
        findings, n_files, notes = scan_paths(args.paths, exclude=args.exclude)
    except ScanError as e:
        print(f"pt215.upgrade: error: {e}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"pt215.upgrade: note: {note}", file=sys.stderr)
    if args.format == "json":
        print(json.dumps({"files_scanned": n_files, "findings": [f.as_dict() for f in findings]}, indent=2))
    else:
        for f in findings:
            print(f.text())
        if findings:
            print(f"Found {len(findings)} finding{'s' if len(findings) != 1 else ''} "
                  f"in {n_files} file{'s' if n_files != 1 else ''} scanned.")
        else:
            print(f"No findings in {n_files} file{'s' if n_files != 1 else ''} scanned.")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
