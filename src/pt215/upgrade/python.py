"""The Python half of `python -m pt215.upgrade` (chapter 7): findings from the syntax tree, names by import origin.

A name counts as torch's only when the module reached it through torch: `from torch.nn import
LinearCrossEntropyLoss`, `import torch.distributed.checkpoint as dcp` then `dcp.save`, or a `torch.` attribute
chain. A team's own `linear_cross_entropy` or a class that happens to be called `MixedPrecisionPolicy` is not
torch's. The tree is walked once, iteratively (a 400-branch `elif` scans like any other file), recording each
node's parent and scope: a variable is looked up in its own function first, then in the module, so
`writer = FileSystemWriter(...)` in one function does not name the writer of another.

DCP checkpoints (PT1507) are followed to where the metadata is written: a save through a writer (by class, or a
variable holding one), a `StorageWriter`/`FileSystemWriter` subclass whose `finish` pickles `Metadata`, a direct
`pickle.dump` of checkpoint metadata, and the private `_save_state_dict`. A round trip reads with the same torch
and is not reported: a save that the same function loads back, and any save in a test module (`tests/`,
`test_*.py`), which writes for the test's own reads.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import PurePath

from pt215.upgrade.rules import ACC_POLICIES, NEW_IN_215, Finding, finding
from pt215.upgrade.text import (
    ENV_RE,
    LEGACY_BACKEND_RE,
    TARGET_RE,
    classifier_deletions,
    env_finding,
    env_value,
    oldest_python,
    recipe_pin,
    requirement_hits,
)

__all__ = ["PyResult", "Edit", "scan_python", "is_test_module", "STD_FLAG_RE"]

DCP_MODULE = "torch.distributed.checkpoint"
DCP_SAVES = {"save", "async_save", "save_state_dict", "_save_state_dict"}
DCP_LOADS = {"load", "load_state_dict", "async_load", "_load_state_dict", "FileSystemReader"}
#: Torch's writers that pickle `.metadata` in `finish`, and the bases a team's own writer derives from.
PICKLING_WRITERS = {"FileSystemWriter", "_FileSystemWriter", "FsspecWriter", "StorageWriter"}
#: Storage writers that write safetensors and a JSON index rather than the pickled `.metadata`.
NO_METADATA_WRITERS = {"HuggingFaceStorageWriter", "_HuggingFaceStorageWriter", "ConsolidatedHuggingFaceStorageWriter"}
PICKLE_DUMPS = {"pickle.dump", "pickle.dumps", "cloudpickle.dump", "cloudpickle.dumps", "torch.save", "dill.dump"}
CPP_EXTENSION = "torch.utils.cpp_extension"
CPP_CALLS = {"CppExtension", "CUDAExtension", "SyclExtension", "load", "load_inline"}
CPP_FLAG_ARGS = {"extra_compile_args", "extra_cflags", "extra_cuda_cflags", "extra_sycl_cflags"}
STD_FLAG_RE = re.compile(r"(?:-std=|/std:)(?:c|gnu)\+\+(\d\w)")
_DRAFTS = {"0x": 11, "1y": 14, "1z": 17, "2a": 20, "2b": 23, "2c": 26}
FP32 = {"torch.float32", "torch.float", "float32", "fp32", "float"}
PIN_RE = re.compile(r"\s*torch\s*(?:\[[^\]]*\])?\s*((?:===?|!=|~=|<=|>=|<|>)\s*[\w.*+!-]+"
                    r"(?:\s*,\s*(?:===?|!=|~=|<=|>=|<|>)\s*[\w.*+!-]+)*)\s*")
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_SCOPE_TYPES = frozenset(_SCOPES)
#: Nodes with nothing below them that a rule reads: not descended into (contexts, operators).
_LEAF_TYPES = frozenset({ast.Load, ast.Store, ast.Del, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Mod, ast.Pow,
                         ast.BitOr, ast.BitAnd, ast.BitXor, ast.LShift, ast.RShift, ast.FloorDiv, ast.MatMult,
                         ast.And, ast.Or, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Is, ast.IsNot,
                         ast.In, ast.NotIn, ast.Not, ast.Invert, ast.UAdd, ast.USub})
_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)


@dataclass(frozen=True)
class Edit:
    """A mechanical rewrite for `--fix`: replace [start, end) (1-based lines, character columns) by `text`."""

    code: str
    line: int
    start: tuple[int, int]
    end: tuple[int, int]
    text: str


@dataclass
class PyResult:
    findings: list[Finding] = field(default_factory=list)
    pins: list[tuple[int, str]] = field(default_factory=list)
    uses: list[tuple[int, str]] = field(default_factory=list)
    edits: list = field(default_factory=list)


def _dotted(node: ast.AST) -> list[str] | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return parts[::-1]
    return None


def std_year(text: str) -> int | None:
    """The standard of a `-std=c++17` flag's number part (`17` -> 17, `2a` -> 20, `98` -> -2), or None."""
    if text in _DRAFTS:
        return _DRAFTS[text]
    if text.isdigit():
        v = int(text)
        return v - 100 if v >= 90 else v
    return None


def is_test_module(path: str) -> bool:
    """A pytest module: test_*.py or *_test.py, or a file under a tests/ or test/ folder."""
    p = PurePath(path)
    return p.name.startswith("test_") or p.stem.endswith("_test") or any(
        part in ("tests", "test", "unit_tests", "integration_tests") for part in p.parts[:-1])


class _Scan:
    def __init__(self, path: str, text: str, tree: ast.Module, rel: str | None = None):
        self.path, self.text, self.tree = path, text, tree
        self.lines = text.splitlines()
        self.alias: dict[str, str] = {}
        self.parent: dict[int, ast.AST] = {}
        self.scope: dict[int, ast.AST] = {}
        self.assigned: dict[tuple[int, str], list[ast.AST]] = {}
        self.docstrings: set[int] = set()
        self.skip_strings: set[int] = set()
        self.consts: dict[str, ast.AST] = {}
        self.out = PyResult()
        self.fr_new = set(re.findall(r"TORCH_FR_[A-Z_]+", text)) if "TORCH_FR_" in text else set()
        self.test_module = is_test_module(rel if rel is not None else path)
        self.reported: set[tuple[int, str]] = set()

    # ------------------------------------------------------------ names
    def qualname(self, node: ast.AST) -> str | None:
        parts = _dotted(node)
        if parts is None:
            return None
        head = self.alias.get(parts[0], parts[0])
        return ".".join([head, *parts[1:]])

    def torch_name(self, node: ast.AST) -> str | None:
        """The qualified name if the module reached it through torch, else None."""
        q = self.qualname(node)
        return q if q and (q == "torch" or q.startswith("torch.")) else None

    def add(self, line: int, code: str, **fmt: object) -> None:
        if (line, code) in self.reported and code == "PT1507":
            return
        self.reported.add((line, code))
        self.out.findings.append(finding(self.path, line, code, **fmt))

    def segment(self, node: ast.AST) -> str:
        return ast.get_source_segment(self.text, node) or ""

    def col(self, line: int, byte_col: int) -> int:
        text = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        return len(text.encode("utf-8")[:byte_col].decode("utf-8", "replace"))

    def function_of(self, node: ast.AST) -> ast.AST | None:
        while id(node) in self.parent:
            node = self.parent[id(node)]
            if isinstance(node, _FUNCS):
                return node
        return None

    def values_of(self, name: ast.AST) -> list[ast.AST]:
        """What a variable was assigned: in the scope of its use (and the scopes around it), else the module."""
        parts = _dotted(name)
        if not parts:
            return []
        key = ".".join(parts)
        scope = self.scope.get(id(name))
        while scope is not None:
            hit = self.assigned.get((id(scope), key))
            if hit:
                return hit
            scope = self.scope.get(id(scope))
        return self.assigned.get((id(self.tree), key), [])

    # ------------------------------------------------------------ one walk
    def index(self) -> dict[str, list[ast.AST]]:
        """One iterative walk: parents, scopes, imports, assignments, docstrings, and the nodes the checks read.

        Written for speed (it is most of the scan's cost beyond `ast.parse`): children are read from `_fields`
        directly, nodes are dispatched on their exact type, and leaves (names, constants, contexts) are not
        descended into."""
        want: dict[str, list[ast.AST]] = {"const": [], "keyword": [], "call": [], "load": [], "class": [],
                                          "dict": [], "fstring": []}
        track_loads = "_transport" in self.text or "param_dtype_override_fn" in self.text
        parent, scopes, docstrings = self.parent, self.scope, self.docstrings
        scope_types, leaf_types = _SCOPE_TYPES, _LEAF_TYPES
        AST, Constant, Name, Attribute = ast.AST, ast.Constant, ast.Name, ast.Attribute
        stack: list[tuple[ast.AST, ast.AST]] = [(self.tree, self.tree)]
        while stack:
            node, scope = stack.pop()
            kind = type(node)
            if kind is Constant:
                if type(node.value) is str:
                    want["const"].append(node)
                continue
            if kind is Name:
                if track_loads and type(node.ctx) is ast.Load:
                    want["load"].append(node)
                continue
            inner = node if kind in scope_types else scope
            for name in node._fields:
                value = getattr(node, name, None)
                if type(value) is list:
                    for child in value:
                        if isinstance(child, AST) and type(child) not in leaf_types:
                            parent[id(child)] = node
                            scopes[id(child)] = inner
                            stack.append((child, inner))
                elif isinstance(value, AST) and type(value) not in leaf_types:
                    parent[id(value)] = node
                    scopes[id(value)] = inner
                    stack.append((value, inner))
            if kind is ast.Call:
                want["call"].append(node)
            elif kind is ast.keyword:
                want["keyword"].append(node)
            elif kind is Attribute:
                if track_loads and type(node.ctx) is ast.Load:
                    want["load"].append(node)
            elif kind is ast.Expr:
                if type(node.value) is Constant and type(node.value.value) is str:
                    docstrings.add(id(node.value))  # a docstring, or a field's or a block's bare string: prose
            elif kind is ast.Assign or kind is ast.AnnAssign:
                if node.value is not None:
                    for tgt in node.targets if kind is ast.Assign else [node.target]:
                        parts = _dotted(tgt)
                        if parts:
                            self.assigned.setdefault((id(scope), ".".join(parts)), []).append(node.value)
                            if scope is self.tree and len(parts) == 1:
                                self.consts[parts[0]] = node.value
            elif kind is ast.Import:
                for a in node.names:
                    self.alias[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                    if a.name.startswith("torch.distributed._transport"):
                        self.out.uses.append((node.lineno, "torch.distributed._transport"))
            elif kind is ast.ImportFrom:
                if node.level == 0 and node.module:
                    for a in node.names:
                        full = f"{node.module}.{a.name}"
                        self.alias[a.asname or a.name] = full
                        if full.startswith("torch.distributed._transport") or full in NEW_IN_215:
                            self.out.uses.append((node.lineno, full))
            elif kind is ast.ClassDef:
                want["class"].append(node)
            elif kind is ast.Dict:
                want["dict"].append(node)
            elif kind is ast.JoinedStr:
                want["fstring"].append(node)
        for n in want["fstring"]:
            self.skip_strings.update(id(v) for v in n.values if type(v) is Constant)
        return want

    # ------------------------------------------------------------ strings folded from constants
    def fold(self, node: ast.AST, depth: int = 0) -> str | None:
        """A string expression's value when it is built from literals and module constants (an f-string, `+`,
        `"12.8".replace(".", "")`); unknown parts become `{?}`. None when nothing is known."""
        if depth > 4:
            return None
        if isinstance(node, ast.Constant):
            return node.value if isinstance(node.value, str) else None
        if isinstance(node, ast.JoinedStr):
            parts = []
            for v in node.values:
                if isinstance(v, ast.Constant):
                    parts.append(str(v.value))
                elif isinstance(v, ast.FormattedValue):
                    parts.append(self.fold(v.value, depth + 1) or "{?}")
            return "".join(parts)
        if isinstance(node, ast.Name) and node.id in self.consts:
            return self.fold(self.consts[node.id], depth + 1)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            a, b = self.fold(node.left, depth + 1), self.fold(node.right, depth + 1)
            return None if a is None and b is None else (a or "{?}") + (b or "{?}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "replace", "strip", "lower", "upper"):
            base = self.fold(node.func.value, depth + 1)
            args = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if base is None or len(args) != len(node.args):
                return None
            return getattr(base, node.func.attr)(*args)
        return None

    # ------------------------------------------------------------ passes
    def run(self) -> PyResult:
        want = self.index()
        writers = self.writer_classes(want["class"])
        loads = self.dcp_loads(want["call"]) if DCP_MODULE in self.text or any(
            q.startswith(DCP_MODULE) for q in self.alias.values()) else set()
        for node in want["const"]:
            if id(node) not in self.docstrings and id(node) not in self.skip_strings:
                self.constant(node, node.value)
        for node in want["fstring"]:
            text = self.fold(node)
            if text:
                self.constant(node, text)
        for node in want["keyword"]:
            self.keyword(node)
        for node in want["dict"]:
            self.dict_node(node)
        for node in want["class"]:
            if writers.get(node.name) == "pickles":
                self.writer_finish(node)
        for node in want["call"]:
            self.call(node, writers, loads)
        for node in want["load"]:
            q = self.torch_name(node)
            if q in NEW_IN_215:
                self.out.uses.append((node.lineno, q))
        return self.out

    def writer_classes(self, classes: list[ast.ClassDef]) -> dict[str, str]:
        """Classes of this module that are DCP writers: "pickles" (FileSystemWriter/StorageWriter lineage) or "hf"."""
        out: dict[str, str] = {}
        for _ in range(3):  # a writer deriving from a writer defined further down
            for cls in classes:
                for base in cls.bases:
                    q = self.qualname(base) or ""
                    last = q.rsplit(".", 1)[-1]
                    if last in NO_METADATA_WRITERS or out.get(last) == "hf":
                        out[cls.name] = "hf"
                    elif (q.startswith(DCP_MODULE) and last in PICKLING_WRITERS) or out.get(last) == "pickles":
                        out.setdefault(cls.name, "pickles")
        return out

    def dcp_loads(self, calls: list[ast.Call]) -> set[int | None]:
        """The functions (ids; None for module level) that load a DCP checkpoint (their saves are round trips)."""
        out: set[int | None] = set()
        for node in calls:
            q = self.torch_name(node.func) or ""
            reader = next((k.value for k in node.keywords if k.arg == "storage_reader"), None)
            if reader is not None and any(c.startswith("HuggingFace") for c in self.writer_names(reader)):
                continue  # reads safetensors: converting from HF, not reading back a DCP checkpoint
            if q.startswith(DCP_MODULE) and q.rsplit(".", 1)[-1] in DCP_LOADS:
                fn = self.function_of(node)
                out.add(id(fn) if fn is not None else None)
        return out

    # ------------------------------------------------------------ nodes
    def constant(self, node: ast.AST, text: str) -> None:
        line = node.lineno
        if "TORCH_" in text and not self.warning_filter(node):
            for m in ENV_RE.finditer(text):
                value = env_value(text, m.end()) if m.end() < len(text) else self.env_value_of(node)
                f = env_finding(self.path, line + text.count("\n", 0, m.start()), m.group(1), self.fr_new, value)
                if f:
                    self.out.findings.append(f)
            for m in TARGET_RE.finditer(text):
                self.out.findings += target_findings(self.path, line, m.group(1))
        if "nccl-legacy" in text:
            for m in LEGACY_BACKEND_RE.finditer(text):
                self.add(line + text.count("\n", 0, m.start()), "PT1504")
        if "torch" in text:
            m = PIN_RE.fullmatch(text)
            if m:
                self.out.pins.append((line, m.group(1)))
        if "cu1" in text or "cuda" in text or "nvidia" in text or "nccl" in text or "cudnn" in text:
            named = self.assigned_name(node)
            for offset, code, fmt in requirement_hits(text):
                if named and code == "PT1512" and recipe_pin(named):  # `tch270_cu128 = "..."`: a named variant
                    code, fmt = "PT1519", {"what": f"{fmt['what']} is a CUDA 12 build, named {named}",
                                           "pin": recipe_pin(named)}
                self.add(line + text.count("\n", 0, offset), code, **fmt)

    def warning_filter(self, node: ast.AST) -> bool:
        """A string given to warnings.filterwarnings (a message pattern, not a setting)."""
        p = self.parent.get(id(node))
        if isinstance(p, ast.keyword):
            p = self.parent.get(id(p))
        return isinstance(p, ast.Call) and (self.qualname(p.func) or "").rsplit(".", 1)[-1] in (
            "filterwarnings", "simplefilter", "filterwarning")

    def assigned_name(self, node: ast.AST) -> str | None:
        """The variable (or enum member) a string is assigned to, where that is its direct parent."""
        p = self.parent.get(id(node))
        if isinstance(p, (ast.Assign, ast.AnnAssign)):
            targets = p.targets if isinstance(p, ast.Assign) else [p.target]
            parts = _dotted(targets[0]) if targets else None
            return parts[-1] if parts else None
        return None

    def env_value_of(self, node: ast.AST) -> str | None:
        """The value a variable named by this string is set to, from where the string stands:
        `os.environ["X"] = "0"`, `setdefault("X", "0")`, `monkeypatch.setenv("X", "0")`, `{"X": "0"}`."""
        p = self.parent.get(id(node))
        value: ast.AST | None = None
        if isinstance(p, ast.Subscript):
            gp = self.parent.get(id(p))
            if isinstance(gp, ast.Assign) and p in gp.targets:
                value = gp.value
        elif isinstance(p, ast.Call) and p.args and p.args[0] is node and len(p.args) > 1:
            value = p.args[1]
        elif isinstance(p, ast.Dict):
            for k, v in zip(p.keys, p.values, strict=True):
                if k is node:
                    value = v
        if isinstance(value, ast.Constant) and isinstance(value.value, (str, int)):
            return str(value.value)
        return None

    def keyword(self, node: ast.keyword) -> None:
        if node.arg and node.arg.startswith("TORCH_") and ENV_RE.fullmatch(node.arg):
            v = node.value.value if isinstance(node.value, ast.Constant) else None
            f = env_finding(self.path, node.value.lineno, node.arg, self.fr_new, None if v is None else str(v))
            if f:
                self.out.findings.append(f)
        if node.arg == "acc_policy":
            self.acc_policy(node.value)
        if node.arg == "python_requires":
            self.python_requires(node.value, "python_requires")

    def dict_node(self, node: ast.Dict) -> None:
        for k, v in zip(node.keys, node.values, strict=True):
            if isinstance(k, ast.Constant) and k.value == "python_requires":
                self.python_requires(v, '"python_requires"')

    def python_requires(self, value: ast.AST, what: str) -> None:
        if not (isinstance(value, ast.Constant) and isinstance(value.value, str)):
            return
        low = oldest_python(value.value)
        if low:
            self.add(value.lineno, "PT1508", what=f"{what}={value.value!r}", low=low)
            if re.fullmatch(r"\s*>=\s*3(\.\d+)*\s*", value.value):
                quote = self.segment(value)[:1] or '"'
                self.edit("PT1508", value, f"{quote}>=3.11{quote}")
                self.out.edits.extend(classifier_deletions(self.lines, value.lineno))

    def acc_policy(self, value: ast.AST) -> None:
        if isinstance(value, ast.Constant) and isinstance(value.value, str) and value.value not in ACC_POLICIES:
            self.add(value.lineno, "PT1506", value=value.value)

    def edit(self, code: str, node: ast.AST, text: str, *, at_end: bool = False) -> None:
        end_line, end_col = node.end_lineno or node.lineno, node.end_col_offset or 0
        start = (end_line, self.col(end_line, end_col)) if at_end else (node.lineno, self.col(node.lineno,
                                                                                              node.col_offset))
        self.out.edits.append(Edit(code, node.lineno, start, (end_line, self.col(end_line, end_col)), text))

    def call(self, node: ast.Call, writers: dict[str, str], loads: set[int | None]) -> None:
        q = self.qualname(node.func) or ""
        if q in PICKLE_DUMPS and node.args and "metadata" in (self.segment(node.args[0]).lower()) and (
                any(a.startswith(DCP_MODULE) for a in self.alias.values())):
            self.add(node.lineno, "PT1507", writer=f"{q}({self.segment(node.args[0])}) writes checkpoint metadata")
        name = q if q == "torch" or q.startswith("torch.") else ""
        if not name:
            return
        last = name.rsplit(".", 1)[-1]
        kw = {k.arg: k.value for k in node.keywords}
        if last == "MixedPrecisionPolicy":
            self.mixed_precision(node, kw)
        if last == "LinearCrossEntropyOptions" and len(node.args) > 3:
            self.acc_policy(node.args[3])
        if name.startswith(DCP_MODULE) and last in DCP_SAVES and not self.test_module:
            fn = self.function_of(node)  # a test writes checkpoints for its own reads: never reported
            if (id(fn) if fn is not None else None) not in loads:
                self.dcp_save(node, kw, last, writers)
        if name in ("torch.load", "torch.serialization.load"):
            self.torch_load(node, kw)
        if last == "init_process_group" and name.startswith("torch.distributed"):
            self.init_pg(node, kw)
        if name.startswith(CPP_EXTENSION) and last in CPP_CALLS:
            self.cpp_flags(node, last)

    def torch_load(self, node: ast.Call, kw: dict[str | None, ast.AST]) -> None:
        """PT1510: a torch.load that unpickles whatever the file holds: `weights_only=False`, or a `pickle_module`
        without `weights_only=True` (serialization.py: `_default_to_weights_only` is True only when
        pickle_module is None, so any pickle_module turns the weights-only default off)."""
        wo = kw.get("weights_only")
        if isinstance(wo, ast.Constant) and wo.value is False:
            self.add(wo.lineno, "PT1510", what="torch.load(..., weights_only=False)")
            return
        pm = kw.get("pickle_module", node.args[2] if len(node.args) > 2 else None)
        if pm is None or (isinstance(pm, ast.Constant) and pm.value is None):
            return
        if isinstance(wo, ast.Constant) and wo.value is True:
            return  # weights_only=True with a pickle_module raises at once (RuntimeError): nothing runs silently
        if wo is None and None in kw:
            return  # **kwargs may carry weights_only: the call does not say it all
        self.add(pm.lineno, "PT1510", what=f"torch.load(..., pickle_module={self.segment(pm)}) without "
                                          "weights_only=True turns weights-only loading off and")

    def mixed_precision(self, node: ast.Call, kw: dict[str | None, ast.AST]) -> None:
        if "param_dtype_override_fn" in kw:
            self.out.uses.append((node.lineno, "torch.distributed.fsdp.MixedPrecisionPolicy.param_dtype_override_fn"))
        if None in kw:  # **kwargs: the call does not say it all
            return
        param = kw.get("param_dtype", node.args[0] if node.args else None)
        reduce = kw.get("reduce_dtype", node.args[1] if len(node.args) > 1 else None)
        if param is None or (isinstance(param, ast.Constant) and param.value is None):
            return
        src = self.segment(param)
        if src.strip("'\"") in FP32 or (self.torch_name(param) or "") in FP32:
            return  # fp32 compute: 2.14 and 2.15 both reduce in fp32
        if reduce is None:
            self.add(node.lineno, "PT1505", param=src, how="no reduce_dtype")
            self.edit("PT1505", param, f", reduce_dtype={src}", at_end=True)
        elif isinstance(reduce, ast.Constant) and reduce.value is None:
            self.add(reduce.lineno, "PT1505", param=src, how="reduce_dtype=None")
            self.edit("PT1505", reduce, src)

    def writer_names(self, writer: ast.AST) -> list[str]:
        """The class names a storage_writer argument may hold ("?" for what the scan cannot see)."""
        if isinstance(writer, ast.Call):
            return [(self.qualname(writer.func) or "?").rsplit(".", 1)[-1]]
        if isinstance(writer, (ast.Name, ast.Attribute)):
            vals = self.values_of(writer)
            names = []
            for v in vals:
                if isinstance(v, ast.Call):
                    names.append((self.qualname(v.func) or "?").rsplit(".", 1)[-1])
                elif isinstance(v, ast.Constant) and v.value is None:
                    names.append("FileSystemWriter (the default, when it stays None)")
                else:
                    names.append("?")
            return names or ["?"]
        return ["?"]

    def dcp_save(self, node: ast.Call, kw: dict[str | None, ast.AST], last: str, writers: dict[str, str]) -> None:
        writer = kw.get("storage_writer")
        if writer is None and len(node.args) > 1:
            writer = node.args[1]
        call = f"DCP {last}" if last != "_save_state_dict" else "the private _save_state_dict"
        what = "FileSystemWriter (the default)"
        if writer is not None and not (isinstance(writer, ast.Constant) and writer.value is None):
            classes = self.writer_names(writer)
            hf = [c for c in classes if c in NO_METADATA_WRITERS or writers.get(c) == "hf"]
            if len(hf) == len(classes):
                return
            known = [c for c in classes if c not in hf and c != "?"]
            what = known[0] if known else f"{self.segment(writer) or 'a writer'} (when it is not a HuggingFace writer)"
        self.add(node.lineno, "PT1507", writer=f"{call} through {what} pickles .metadata")

    def writer_finish(self, cls: ast.ClassDef) -> None:
        """A writer class's own `finish(self, metadata, results)` that pickles the Metadata it is given."""
        for fn in cls.body:
            if not isinstance(fn, _FUNCS) or fn.name != "finish" or len(fn.args.args) < 2:
                continue
            meta = fn.args.args[1].arg
            for sub in ast.walk(fn):
                if isinstance(sub, ast.Call) and (self.qualname(sub.func) or "") in PICKLE_DUMPS and any(
                        isinstance(a, ast.Name) and a.id == meta for a in sub.args):
                    self.add(sub.lineno, "PT1507", writer=f"{cls.name}.finish pickles the checkpoint Metadata")

    def init_pg(self, node: ast.Call, kw: dict[str | None, ast.AST]) -> None:
        backend = kw.get("backend", node.args[0] if node.args else None)
        if None in kw or "device_id" in kw or not isinstance(backend, ast.Constant):
            return
        value = backend.value
        if isinstance(value, str) and re.fullmatch(r"nccl|(?:cpu:gloo,)?cuda:nccl(?:,cpu:gloo)?", value.strip()):
            self.add(node.lineno, "PT1515")

    def flag_strings(self, node: ast.AST, depth: int = 0) -> list[ast.Constant]:
        """The string literals an argument is built from: lists, dicts (`{"cxx": [...]}`), `+`, and variables."""
        if depth > 4:
            return []
        if isinstance(node, ast.Constant):
            return [node] if isinstance(node.value, str) else []
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return [s for e in node.elts for s in self.flag_strings(e, depth + 1)]
        if isinstance(node, ast.Dict):
            return [s for v in node.values if v is not None for s in self.flag_strings(v, depth + 1)]
        if isinstance(node, ast.BinOp):
            return self.flag_strings(node.left, depth + 1) + self.flag_strings(node.right, depth + 1)
        if isinstance(node, (ast.Name, ast.Attribute)):
            return [s for v in self.values_of(node) for s in self.flag_strings(v, depth + 1)]
        if isinstance(node, ast.Starred):
            return self.flag_strings(node.value, depth + 1)
        return []

    def cpp_flags(self, node: ast.Call, last: str) -> None:
        """PT1516: a -std below C++20 given to torch's cpp_extension, which compiles torch's headers with it."""
        for k in node.keywords:
            if k.arg not in CPP_FLAG_ARGS:
                continue
            for s in self.flag_strings(k.value):
                for m in STD_FLAG_RE.finditer(s.value):
                    year = std_year(m.group(1))
                    if year is None or year >= 20:
                        continue
                    if last in ("load", "load_inline") and k.arg == "extra_cuda_cflags":
                        fix = (f"{last}() adds -std=c++20 to nvcc's flags only when extra_cuda_cflags hold no "
                               "-std, so this flag decides the standard: use -std=c++20 or drop the flag")
                    elif last in ("load", "load_inline"):
                        fix = (f"{last}() puts these flags after its own -std=c++20 and the last -std wins: use "
                               "-std=c++20 or drop the flag")
                    else:
                        fix = ("BuildExtension adds its own -std=c++20 only when no -std is given, so this flag "
                               "decides the standard: use -std=c++20 or drop the flag")
                    self.add(s.lineno, "PT1516", what=f"{m.group(0)} in {k.arg} of {last}", fix=fix)


def target_findings(path: str, line: int, value: str) -> list[Finding]:
    """PT1511 when a TORCH_TARGET_VERSION value targets a torch newer than 2.15."""
    try:
        v = int(value, 0)
    except ValueError:
        return []
    major, minor = v >> 56, (v >> 48) & 0xFF
    if (major, minor) > (2, 15):
        return [finding(path, line, "PT1511", value=value, target=f"{major}.{minor}")]
    return []


def scan_python(text: str, path: str, rel: str | None = None) -> PyResult:
    """Scan Python source (`rel`: its path inside the scanned folder, which tells a test module); raises
    SyntaxError (or RecursionError/MemoryError from the parser) when it cannot be parsed, so that the caller can
    fall back to patterns with a note."""
    tree = ast.parse(text, filename=path)
    return _Scan(path, text, tree, rel).run()
