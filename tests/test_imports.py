"""No import circles in `pt215` (CONTRIBUTING.md): the graph of `pt215` imports, read with `ast`, has no cycle.

Every `import pt215...` and `from pt215... import ...` counts, at the top of a module and inside a function
alike: an import moved into a function to dodge a circle is still a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "pt215"


def module_name(path: Path, package: Path = PACKAGE) -> str:
    """`src/pt215/site/book.py` -> `pt215.site.book`; a package's `__init__.py` -> the package."""
    parts = [package.name, *path.relative_to(package).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package, subpackages included."""
    return {module_name(p, package): p for p in sorted(package.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that module `name` (at `path`) imports, anywhere in its code."""
    is_package = path.name == "__init__.py"
    root = name.split(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == root)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package, one level up per extra dot
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            if source.split(".")[0] != root:
                continue
            for alias in node.names:  # `from pt215 import fp8` imports the module pt215.fp8
                sub = f"{source}.{alias.name}"
                found.add(sub if sub in known else source)
    return {m for m in found if m in known and m != name}


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the package's modules it imports."""
    mods = modules(package)
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path `[a, b, ..., a]`, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_graph_sees_top_level_and_function_level_imports(tmp_path):
    pkg = tmp_path / "pt215"
    (pkg / "site").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pt215 import b\nimport pt215.site.c\n")
    (pkg / "b.py").write_text("def f():\n    from pt215.a import x\n")
    (pkg / "site" / "__init__.py").write_text("from . import c\n")
    (pkg / "site" / "c.py").write_text("from ..b import f\nimport os\n")
    graph = import_graph(pkg)
    assert graph == {"pt215": set(), "pt215.a": {"pt215.b", "pt215.site.c"}, "pt215.b": {"pt215.a"},
                     "pt215.site": {"pt215.site.c"}, "pt215.site.c": {"pt215.b"}}
    assert find_cycle(graph) == ["pt215.a", "pt215.b", "pt215.a"]
    assert find_cycle({"x": {"y"}, "y": {"z"}, "z": set()}) is None


def test_the_package_graph_is_read():
    graph = import_graph()
    assert "pt215.fp8" in graph["pt215.moe"] and "pt215.moe" in graph["pt215.fsdp"]


@pytest.mark.parametrize("package", [PACKAGE], ids=["pt215"])
def test_no_import_cycle(package):
    cycle = find_cycle(import_graph(package))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


# ---------------------------------------------------------------- the house: two tools in rooms of their own

TOOLS = ("pt215.upgrade", "pt215.verify", "pt215.site")
#: Reader-facing modules allowed to import a tool, and why: the doctor shares the upgrade checklist's environment
#: checks (chapter 7 teaches them; the doctor runs the same ones before a workshop). `boundary` is the old spelling
#: of `python -m pt215.verify.boundary`, kept as an alias.
ALLOWED = {"pt215.doctor": {"pt215.upgrade.environment"}, "pt215.boundary": {"pt215.verify.boundary"}}


def test_no_flat_module_is_named_for_a_tool():
    flat = sorted(p.name for p in PACKAGE.glob("*.py") if p.name.startswith(("upgrade_", "gated_", "verify_")))
    assert flat == [], f"these belong in pt215/upgrade/ or pt215/verify/: {flat}"
    assert (PACKAGE / "upgrade" / "__main__.py").is_file() and (PACKAGE / "verify" / "__main__.py").is_file()


def test_reader_modules_import_no_tool_package():
    graph = import_graph()
    readers = {m for m in graph if m != "pt215" and not m.startswith(tuple(t + "." for t in TOOLS)) and m not in TOOLS}
    offenders = {}
    for m in sorted(readers):
        bad = {n for n in graph[m] if n.startswith(TOOLS)} - ALLOWED.get(m, set())
        if bad:
            offenders[m] = sorted(bad)
    assert offenders == {}, offenders


def test_the_package_docstring_maps_every_reader_module():
    """`pt215/__init__.py`'s docstring is the reader's map: one line per flat module, subpackages named."""
    import pt215

    doc = pt215.__doc__ or ""
    flat = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    missing = [m for m in flat if f"`{m}`" not in doc]
    assert missing == [], f"pt215/__init__.py's docstring does not name: {missing}"
    for sub in ("upgrade", "verify", "site"):
        assert f"`{sub}/`" in doc
