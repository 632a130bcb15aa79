"""The Python half of `python -m pt215.upgrade` (chapter 7): findings from the syntax tree, names by import origin.

A name counts as torch's only when the module reached it through torch: `from torch.nn import
LinearCrossEntropyLoss`, `import torch.distributed.checkpoint as dcp` then `dcp.save`, or a `torch.` attribute
chain. A team's own `linear_cross_entropy` or a class that happens to be called `MixedPrecisionPolicy` is not
torch's. The walk is iterative (`ast.walk`), so a 400-branch `elif` or a long string concatenation scans like
any other file.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from pt215.upgrade_rules import ACC_POLICIES, NEW_IN_215, Finding, finding
from pt215.upgrade_text import ENV_RE, LEGACY_BACKEND_RE, TARGET_RE, env_finding, oldest_python, requirement_hits

__all__ = ["PyResult", "Edit", "scan_python"]

DCP_MODULE = "torch.distributed.checkpoint"
DCP_SAVES = {"save", "async_save", "save_state_dict"}
#: Storage writers that write safetensors and a JSON index rather than the pickled `.metadata`.
NO_METADATA_WRITERS = {"HuggingFaceStorageWriter", "_HuggingFaceStorageWriter", "ConsolidatedHuggingFaceStorageWriter"}
FP32 = {"torch.float32", "torch.float", "float32", "fp32", "float"}
PIN_RE = re.compile(r"\s*torch\s*(?:\[[^\]]*\])?\s*((?:===?|!=|~=|<=|>=|<|>)\s*[\w.*+!-]+"
                    r"(?:\s*,\s*(?:===?|!=|~=|<=|>=|<|>)\s*[\w.*+!-]+)*)\s*")


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
    edits: list[Edit] = field(default_factory=list)


def _dotted(node: ast.AST) -> list[str] | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return parts[::-1]
    return None


class _Scan:
    def __init__(self, path: str, text: str, tree: ast.AST):
        self.path, self.text, self.lines, self.tree = path, text, text.splitlines(), tree
        self.alias: dict[str, str] = {}
        self.assigned: dict[str, list[str]] = {}
        self.docstrings: set[int] = set()
        self.round_trip: set[int] = set()  # calls in a function that also loads a DCP checkpoint
        self.out = PyResult()
        self.fr_new = set(re.findall(r"TORCH_FR_[A-Z_]+", text))

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
        self.out.findings.append(finding(self.path, line, code, **fmt))

    def segment(self, node: ast.AST) -> str:
        return ast.get_source_segment("\n".join(self.lines), node) or ""

    def col(self, line: int, byte_col: int) -> int:
        text = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        return len(text.encode("utf-8")[:byte_col].decode("utf-8", "replace"))

    # ------------------------------------------------------------ passes
    def run(self) -> PyResult:
        nodes = list(ast.walk(self.tree))
        for node in nodes:
            body = getattr(node, "body", None)
            if isinstance(body, list):
                for st in body:
                    if isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant) and isinstance(
                            st.value.value, str):
                        self.docstrings.add(id(st.value))
            if isinstance(node, ast.Import):
                for a in node.names:
                    self.alias[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                    if a.name.startswith("torch.distributed._transport"):
                        self.out.uses.append((node.lineno, "torch.distributed._transport"))
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    self.alias[a.asname or a.name] = full
                    if full.startswith("torch.distributed._transport") or full in NEW_IN_215:
                        self.out.uses.append((node.lineno, full))
        for node in nodes:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                v = node.value
                q = (self.qualname(v.func) if isinstance(v, ast.Call) else None) or "?"
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    parts = _dotted(t)
                    if parts:
                        self.assigned.setdefault(".".join(parts), []).append(q)
        if any(q.startswith(DCP_MODULE) for q in self.alias.values()) or "torch.distributed.checkpoint" in self.text:
            self.find_round_trips(nodes)
        for node in nodes:
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in self.docstrings:
                self.constant(node)
            elif isinstance(node, ast.keyword):
                self.keyword(node)
            elif isinstance(node, ast.Call):
                self.call(node)
            elif isinstance(node, (ast.Name, ast.Attribute)) and isinstance(getattr(node, "ctx", None), ast.Load):
                q = self.torch_name(node)
                if q in NEW_IN_215:
                    self.out.uses.append((node.lineno, q))
        return self.out

    def find_round_trips(self, nodes: list[ast.AST]) -> None:
        """Mark the DCP saves of every function that also loads a DCP checkpoint (a round trip, one torch)."""
        saves, loads = [], []
        for node in nodes:
            if isinstance(node, ast.Call):
                q = self.torch_name(node.func) or ""
                if q.startswith(DCP_MODULE):
                    last = q.rsplit(".", 1)[-1]
                    (saves if last in DCP_SAVES else loads if last in ("load", "load_state_dict") else []).append(node)
        if not saves or not loads:
            return
        parent: dict[int, ast.AST] = {}
        for node in nodes:
            for child in ast.iter_child_nodes(node):
                parent[id(child)] = node

        def function_of(node: ast.AST) -> int | None:
            while id(node) in parent:
                node = parent[id(node)]
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    return id(node)
            return None

        loading = {function_of(n) for n in loads} - {None}
        self.round_trip.update(id(n) for n in saves if function_of(n) in loading)

    # ------------------------------------------------------------ nodes
    def constant(self, node: ast.Constant) -> None:
        text: str = node.value  # type: ignore[assignment]
        line = node.lineno
        for m in ENV_RE.finditer(text):
            f = env_finding(self.path, line + text.count("\n", 0, m.start()), m.group(1), self.fr_new)
            if f:
                self.out.findings.append(f)
        for m in LEGACY_BACKEND_RE.finditer(text):
            self.add(line + text.count("\n", 0, m.start()), "PT1504")
        m = PIN_RE.fullmatch(text)
        if m:
            self.out.pins.append((line, m.group(1)))
        for m in TARGET_RE.finditer(text):
            self.out.findings += target_findings(self.path, line, m.group(1))
        for offset, code, fmt in requirement_hits(text):
            self.add(line + text.count("\n", 0, offset), code, **fmt)

    def keyword(self, node: ast.keyword) -> None:
        if node.arg and ENV_RE.fullmatch(node.arg):
            f = env_finding(self.path, node.value.lineno, node.arg, self.fr_new)
            if f:
                self.out.findings.append(f)
        if node.arg == "acc_policy":
            self.acc_policy(node.value)
        if node.arg == "python_requires" and isinstance(node.value, ast.Constant) and isinstance(
                node.value.value, str):
            low = oldest_python(node.value.value)
            if low:
                self.add(node.value.lineno, "PT1508", what=f"python_requires={node.value.value!r}", low=low)
                if re.fullmatch(r"\s*>=\s*3(\.\d+)*\s*", node.value.value):
                    quote = self.segment(node.value)[:1] or '"'
                    self.edit("PT1508", node.value, f"{quote}>=3.11{quote}")

    def acc_policy(self, value: ast.AST) -> None:
        if isinstance(value, ast.Constant) and isinstance(value.value, str) and value.value not in ACC_POLICIES:
            self.add(value.lineno, "PT1506", value=value.value)

    def edit(self, code: str, node: ast.AST, text: str, *, at_end: bool = False) -> None:
        end_line, end_col = node.end_lineno or node.lineno, node.end_col_offset or 0
        start = (end_line, self.col(end_line, end_col)) if at_end else (node.lineno, self.col(node.lineno,
                                                                                              node.col_offset))
        self.out.edits.append(Edit(code, node.lineno, start, (end_line, self.col(end_line, end_col)), text))

    def call(self, node: ast.Call) -> None:
        name = self.torch_name(node.func) or ""
        last = name.rsplit(".", 1)[-1]
        kw = {k.arg: k.value for k in node.keywords}
        if not name:
            return
        if last == "MixedPrecisionPolicy":
            self.mixed_precision(node, kw)
        if last == "LinearCrossEntropyOptions" and len(node.args) > 3:
            self.acc_policy(node.args[3])
        if name.startswith(DCP_MODULE) and last in DCP_SAVES and id(node) not in self.round_trip:
            self.dcp_save(node, kw)
        if name in ("torch.load", "torch.serialization.load"):
            wo = kw.get("weights_only")
            if isinstance(wo, ast.Constant) and wo.value is False:
                self.add(wo.lineno, "PT1510", what="torch.load(..., weights_only=False)")
        if last == "init_process_group" and name.startswith("torch.distributed"):
            if "enable_reconfigure" in kw:
                self.out.uses.append((node.lineno, "torch.distributed.init_process_group.enable_reconfigure"))
            self.init_pg(node, kw)

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

    def dcp_save(self, node: ast.Call, kw: dict[str | None, ast.AST]) -> None:
        writer = kw.get("storage_writer")
        if writer is None and len(node.args) > 1:
            writer = node.args[1]
        what = "FileSystemWriter (the default)"
        if writer is not None and not (isinstance(writer, ast.Constant) and writer.value is None):
            if isinstance(writer, ast.Call):
                classes = [(self.qualname(writer.func) or "?").rsplit(".", 1)[-1]]
            else:
                parts = _dotted(writer)
                classes = [q.rsplit(".", 1)[-1] for q in self.assigned.get(".".join(parts), ["?"])] if parts else ["?"]
            if all(c in NO_METADATA_WRITERS for c in classes):
                return
            known = [c for c in classes if c not in NO_METADATA_WRITERS and c != "?"]
            what = known[0] if known else f"{self.segment(writer) or 'a writer'} (when it is not a HuggingFace writer)"
        self.add(node.lineno, "PT1507", writer=what)

    def init_pg(self, node: ast.Call, kw: dict[str | None, ast.AST]) -> None:
        backend = kw.get("backend", node.args[0] if node.args else None)
        if None in kw or "device_id" in kw or not isinstance(backend, ast.Constant):
            return
        value = backend.value
        if isinstance(value, str) and re.fullmatch(r"nccl|(?:cpu:gloo,)?cuda:nccl(?:,cpu:gloo)?", value.strip()):
            self.add(node.lineno, "PT1515")


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


def scan_python(text: str, path: str) -> PyResult:
    """Scan Python source; raises SyntaxError (or RecursionError/MemoryError from the parser) when it cannot
    be parsed, so that the caller can fall back to patterns with a note."""
    tree = ast.parse(text, filename=path)
    return _Scan(path, text, tree).run()
