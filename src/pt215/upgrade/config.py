"""Which codes a run of `python -m pt215.upgrade` reports (chapter 7): `--select`/`--ignore`/`--extend-select`,
`[tool.pt215.upgrade]` in `pyproject.toml` and `# noqa` comments, with the conventions of ruff and flake8.

```toml
[tool.pt215.upgrade]
ignore = ["PT1507"]                             # codes or prefixes ("PT15" is every code)
extend-select = []
exclude = ["third_party", "*/generated/*"]      # directory names or path globs
per-file-ignores = {"tests/*" = ["PT1510"]}
```
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pt215.upgrade.rules import RULES
from pt215.upgrade.text import NOQA_RE

__all__ = ["ConfigError", "Settings", "expand", "load_config", "noqa_lines", "find_pyproject"]

KEYS = {"select", "ignore", "extend-select", "exclude", "per-file-ignores"}


class ConfigError(ValueError):
    """A code, an option or a `[tool.pt215.upgrade]` table that is not what the scanner expects."""


def expand(codes: Iterable[str], where: str) -> set[str]:
    """Codes and prefixes (`PT1505`, `PT150`, `ALL`) -> the set of codes; raises ConfigError naming `where`."""
    out: set[str] = set()
    for raw in codes:
        code = str(raw).strip().upper()
        if not code:
            continue
        hits = set(RULES) if code == "ALL" else {c for c in RULES if c.startswith(code)}
        if not hits:
            raise ConfigError(f"{where}: unknown code {raw!r}; expected one of {', '.join(RULES)} (or a prefix)")
        out |= hits
    return out


def _split(values: Sequence[str] | None) -> list[str]:
    return [c for v in values or () for c in v.split(",")]


@dataclass
class Settings:
    """What to report. `select` None means every code."""

    select: set[str] | None = None
    ignore: set[str] = field(default_factory=set)
    extend_select: set[str] = field(default_factory=set)
    exclude: list[str] = field(default_factory=list)
    per_file_ignores: dict[str, set[str]] = field(default_factory=dict)
    config: Path | None = None

    def codes(self) -> set[str]:
        base = set(RULES) if self.select is None else set(self.select)
        return (base | self.extend_select) - self.ignore

    def codes_for(self, rel: str) -> set[str]:
        """The codes reported in the file at `rel` (a path relative to the config's folder or as given)."""
        codes = self.codes()
        for pattern, ignored in self.per_file_ignores.items():
            if fnmatch.fnmatch(rel, pattern) or fnmatch.fnmatch(Path(rel).name, pattern):
                codes -= ignored
        return codes

    def excluded(self, rel: str) -> bool:
        parts = Path(rel).parts
        return any(p in parts or fnmatch.fnmatch(rel, p) for p in self.exclude)

    def merge_cli(self, select: Sequence[str] | None, ignore: Sequence[str] | None,
                  extend_select: Sequence[str] | None, exclude: Sequence[str] | None) -> Settings:
        """Command-line options over the file's: --select replaces, --ignore/--extend-select/--exclude add."""
        if select:
            self.select = expand(_split(select), "--select")
        self.ignore |= expand(_split(ignore), "--ignore")
        self.extend_select |= expand(_split(extend_select), "--extend-select")
        self.exclude += list(exclude or ())
        return self


def find_pyproject(start: Path) -> Path | None:
    """The nearest pyproject.toml at or above `start` that has a [tool.pt215.upgrade] table."""
    for d in (start, *start.parents):
        p = d / "pyproject.toml"
        if p.is_file():
            try:
                if re.search(r"^\s*\[tool\.pt215\.upgrade", p.read_text(encoding="utf-8", errors="replace"), re.M):
                    return p
            except OSError:
                continue
    return None


def _strings(value: object, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: expected a list of strings, got {value!r}")
    return value


def load_config(path: Path | None) -> Settings:
    """Settings from a pyproject.toml's [tool.pt215.upgrade] table (empty Settings when `path` is None)."""
    if path is None:
        return Settings()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{path.name}: cannot read [tool.pt215.upgrade] ({e})") from e
    table = data.get("tool", {}).get("pt215", {}).get("upgrade", {})
    where = f"{path.name} [tool.pt215.upgrade]"
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table")
    unknown = set(table) - KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; expected {', '.join(sorted(KEYS))}")
    s = Settings(config=path)
    if "select" in table:
        s.select = expand(_strings(table["select"], f"{where} select"), f"{where} select")
    s.ignore = expand(_strings(table.get("ignore", []), f"{where} ignore"), f"{where} ignore")
    s.extend_select = expand(_strings(table.get("extend-select", []), f"{where} extend-select"),
                             f"{where} extend-select")
    s.exclude = _strings(table.get("exclude", []), f"{where} exclude")
    pfi = table.get("per-file-ignores", {})
    if not isinstance(pfi, dict):
        raise ConfigError(f"{where} per-file-ignores: expected a table of glob = [codes]")
    s.per_file_ignores = {g: expand(_strings(v, f"{where} per-file-ignores {g!r}"), f"{where} per-file-ignores")
                          for g, v in pfi.items()}
    return s


def noqa_lines(text: str) -> dict[int, set[str] | None]:
    """Line -> the codes its `# noqa: PT1505, PT1507` silences, or None for a bare `# noqa` (every code)."""
    out: dict[int, set[str] | None] = {}
    if "noqa" not in text.lower():
        return out
    for n, line in enumerate(text.splitlines(), 1):
        m = NOQA_RE.search(line)
        if m:
            out[n] = None if m.group(1) is None else {c.upper() for c in re.split(r"[\s,]+", m.group(1)) if c}
    return out
