"""The book's math rendered to SVG when the website is built, so no page loads MathJax (1.2 MB) in the browser.

MathJax's Node build (fetched by `scripts/vendor_js.sh` into `_vendor/.mathjax-node/`) runs in one `node` process
for the whole build; each `\\(...\\)` / `\\[...\\]` that Sphinx wrote into a page becomes MathJax's own
`<mjx-container>` with an SVG inside (labelled with its TeX for screen readers). Without node or that folder the
pages keep their TeX and the browser's MathJax renders it, as before. Used by :mod:`pt215.site.extension` for every
page.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

__all__ = ["MathRenderer", "render_math", "share_glyphs"]

_SCRIPT = r"""
const readline = require('readline');
require(process.argv[1] + '/node-main.js').init({
  loader: {paths: {mathjax: process.argv[1]}, load: ['input/tex-full', 'output/svg', 'adaptors/liteDOM']},
  svg: {fontCache: 'local'},
  startup: {typeset: false},
}).then((MathJax) => {
  const adaptor = MathJax.startup.adaptor;
  const lines = readline.createInterface({input: process.stdin});
  lines.on('line', (line) => {
    const {tex, display} = JSON.parse(line);
    let out;
    try {
      const node = MathJax.tex2svg(tex, {display});
      const error = adaptor.tags(node, 'g').some((g) => adaptor.getAttribute(g, 'data-mml-node') === 'merror');
      out = error ? {error: adaptor.textContent(node)} : {svg: adaptor.outerHTML(node)};
    } catch (e) {
      out = {error: String(e.message || e)};
    }
    process.stdout.write(JSON.stringify(out) + '\n');
  });
}).catch((e) => { process.stderr.write('mathjax: ' + e.message + '\n'); process.exit(1); });
"""


class MathRenderer:
    """One node process that turns TeX into SVG; `render` answers from a cache for TeX seen before."""

    def __init__(self, mathjax_es5: Path):
        node = shutil.which("node")
        if node is None:
            raise FileNotFoundError("node is not on PATH (needed to render the book's math at build time)")
        if not (Path(mathjax_es5) / "node-main.js").is_file():
            raise FileNotFoundError(f"no MathJax Node build in {mathjax_es5} (run scripts/vendor_js.sh)")
        self._proc = subprocess.Popen([node, "-e", _SCRIPT, str(Path(mathjax_es5).resolve())], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
        self._cache: dict[tuple[str, bool], str] = {}

    def render(self, tex: str, display: bool) -> str:
        """`<mjx-container ...><svg>...</svg></mjx-container>` for `tex`; ValueError on a TeX error."""
        key = (tex, display)
        if key not in self._cache:
            assert self._proc.stdin is not None and self._proc.stdout is not None
            self._proc.stdin.write(json.dumps({"tex": tex, "display": display}) + "\n")
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
            if not line:
                err = self._proc.stderr.read() if self._proc.stderr else ""
                raise RuntimeError(f"the MathJax node process stopped: {err[-500:]}")
            answer = json.loads(line)
            if "error" in answer:
                raise ValueError(f"TeX error in {tex!r}: {answer['error']}")
            label = html.escape(" ".join(tex.split()), quote=True)
            self._cache[key] = answer["svg"].replace("<svg ", f'<svg aria-label="{label}" ', 1)
        return self._cache[key]

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.close()
            self._proc.wait(timeout=30)


_MATH = re.compile(r'<(?P<tag>span|div) class="math notranslate nohighlight(?P<more>[^"]*)"(?P<attrs>[^>]*)>'
                   r"(?P<tex>.*?)</(?P=tag)>", re.S)


def _strip(tex: str) -> tuple[str, bool | None]:
    tex = tex.strip()
    for left, right, display in (("\\(", "\\)", False), ("\\[", "\\]", True), ("$$", "$$", True)):
        if tex.startswith(left) and tex.endswith(right):
            return tex[len(left): -len(right)], display
    return tex, None


def render_math(body: str, renderer: MathRenderer) -> str:
    """`body` with every Sphinx math element's TeX replaced by its SVG (the element and its class are kept)."""

    def one(m: re.Match[str]) -> str:
        tex, display = _strip(html.unescape(m.group("tex")))
        if display is None:
            display = m.group("tag") == "div"
        svg = renderer.render(tex, display)
        return (f'<{m.group("tag")} class="math notranslate nohighlight pt215-math{m.group("more")}"'
                f'{m.group("attrs")}>{svg}</{m.group("tag")}>')

    return share_glyphs(_MATH.sub(one, body))


_GLYPH = re.compile(r'<path id="MJX-\d+-(?P<key>TEX-[\w-]+)" d="(?P<d>[^"]*)"></path>')
_USE = re.compile(r'xlink:href="#MJX-\d+-(?P<key>TEX-[\w-]+)"')


def share_glyphs(body: str) -> str:
    """`body` with each MathJax glyph defined once for the page: MathJax's local font cache repeats a glyph's path
    in every formula that uses it (263 paths for 63 glyphs on a math-heavy page); here every `<use>` points at one
    hidden `<svg>` of shared definitions, as MathJax's own global cache does in a browser. A glyph name whose paths
    differ between formulas is left as it was."""
    paths: dict[str, str] = {}
    clash: set[str] = set()
    for m in _GLYPH.finditer(body):
        if paths.setdefault(m["key"], m["d"]) != m["d"]:
            clash.add(m["key"])
    shared = {k: d for k, d in paths.items() if k not in clash}
    if not shared:
        return body
    body = _GLYPH.sub(lambda m: "" if m["key"] in shared else m[0], body)
    body = body.replace("<defs></defs>", "")
    body = _USE.sub(lambda m: f'xlink:href="#pt215-mjx-{m["key"]}"' if m["key"] in shared else m[0], body)
    defs = "".join(f'<path id="pt215-mjx-{k}" d="{d}"></path>' for k, d in shared.items())
    return ('<svg style="display: none" aria-hidden="true" xmlns="http://www.w3.org/2000/svg"><defs>'
            f"{defs}</defs></svg>{body}")
