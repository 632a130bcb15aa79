"""`{nb-figure}`: a figure on a chapter page, taken from a notebook's stored output (bound to its evidence).

    :::{nb-figure} 02-2-hang-lab.ipynb::wait_for_graph
    What to look at: rank 3 never entered the all-reduce, so every other rank waits on it.
    :::

The notebook cell drew it with `pt215.figures.show(alt, name="wait_for_graph")`, which stores the PNG with its alt
text and that name in the output's metadata. The directive copies that stored PNG into the site and wraps it in
the book's figure markup, with the content as the caption (what to look at); the alt text stays the notebook's.
A name no output carries fails the build (`-W`), so a page cannot show a figure its notebook no longer draws.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst import Directive

__all__ = ["figure_nodes", "figure_outputs", "setup"]

META_KEY = "pt215_figure"
"""The output-metadata key under which `pt215.figures.show(..., name=...)` stores a figure's name."""


def figure_outputs(notebook: Path) -> dict[str, tuple[bytes, str, str]]:
    """{name: (PNG bytes, alt text, css width)} of the named figures in a notebook's stored outputs."""
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    found: dict[str, tuple[bytes, str, str]] = {}
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []):
            meta = out.get("metadata") or {}
            name = meta.get(META_KEY)
            png = (out.get("data") or {}).get("image/png")
            if name and png:
                info = meta.get("image/png") or {}
                data = base64.b64decode("".join(png) if isinstance(png, list) else png)
                found[name] = (data, str(info.get("alt", "")), str(info.get("width", "")))
    return found


class NbFigure(Directive):
    """`{nb-figure} NOTEBOOK.ipynb::name` with the caption as content."""

    required_arguments = 1
    final_argument_whitespace = False
    has_content = True

    def run(self) -> list[nodes.Node]:
        env = self.state.document.settings.env
        app = env.app
        arg = self.arguments[0]
        if "::" not in arg:
            raise self.error(f"nb-figure: the argument must be NOTEBOOK.ipynb::name, got {arg!r}")
        nb_rel, name = arg.split("::", 1)
        doc_dir = Path(env.doc2path(env.docname)).parent
        notebook = (doc_dir / nb_rel).resolve()
        if not notebook.is_file():
            raise self.error(f"nb-figure: no notebook {nb_rel} beside {env.docname}")
        env.note_dependency(str(notebook))
        figures = figure_outputs(notebook)
        if name not in figures:
            raise self.error(f"nb-figure: {nb_rel} stores no figure named {name!r} (it has: "
                             f"{', '.join(sorted(figures)) or 'none'}); draw it with "
                             f"pt215.figures.show(alt, name={name!r})")
        if not self.content:
            raise self.error("nb-figure: give a caption (what to look at) as the directive's content")
        png, alt, width = figures[name]
        file_name = f"pt215-{hashlib.sha256(png).hexdigest()[:16]}.png"
        images = Path(app.outdir) / "_images"
        images.mkdir(parents=True, exist_ok=True)
        target = images / file_name
        if not target.exists():
            target.write_bytes(png)
        return figure_nodes(self.state, self.content, self.content_offset, file_name, alt, width)


def figure_nodes(state, content, content_offset: int, file_name: str, alt: str, width: str = "") -> list[nodes.Node]:
    """The book's figure markup for `_images/file_name` on the current page: numbered (the page's next figure),
    tap to enlarge, the alt text on the image and `content` parsed as the caption."""
    env = state.document.settings.env
    count = env.temp_data.get("pt215_page_figures", 0) + 1
    env.temp_data["pt215_page_figures"] = count
    href = "../" * env.docname.count("/") + "_images/" + file_name
    style = f' style="--pt215-fig-w: {html.escape(width.removesuffix("px"))}px"' if width else ""
    head = (f'<figure class="pt215-figure pt215-page-figure" id="page-figure-{count}"{style}>'
            f'<div class="pt215-figure-scroll"><a class="reference internal image-reference pt215-zoom" '
            f'href="{href}" title="Open the figure full size"><img alt="{html.escape(alt, quote=True)}" '
            f'src="{href}" /></a></div><figcaption><span class="pt215-fignum">Figure {count}.</span> ')
    tail = ('<span class="pt215-zoom-hint">Tap or click the figure to open it full size.</span>'
            "</figcaption></figure>")
    caption = nodes.container(classes=["pt215-figure-caption"])
    state.nested_parse(content, content_offset, caption)
    return [nodes.raw("", head, format="html"), *caption.children, nodes.raw("", tail, format="html")]


def setup(app) -> dict[str, Any]:
    app.add_directive("nb-figure", NbFigure)
    return {"parallel_read_safe": True}
