"""The website's Sphinx extension (`_config.yml` lists `pt215.site`): a hardware badge and a "last verified"
stamp on chapter pages (:mod:`pt215.site.stamps`), numbered figures, skipped hardware cells as notes, link
previews (:mod:`pt215.site.page_html`), math rendered at build time (:mod:`pt215.site.math_svg`), the workshop
tables (:mod:`pt215.site.workshop`), the recorded hardware runs (:mod:`pt215.site.hardware_runs`) and the whole
book as one download (`scripts/build_download.py`, run when the HTML build finishes).
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

from pt215.site import hardware_runs, page_figures, verdicts, workshop
from pt215.site.config import configure_launch_buttons, read_book_config
from pt215.site.math_svg import MathRenderer, render_math
from pt215.site.page_html import break_names, describe_page, number_figures, skipped_notes
from pt215.site.stamps import badge_html, page_stamp

__all__ = ["DOWNLOAD", "figure_alt_texts", "label_table_cells", "setup"]

# An empty plain-text output: the placeholder pt215.launch shows live output in (emptied when the run ends).
_EMPTY_OUTPUT = re.compile(
    r'<div class="output text_plain[^"]*"><div class="highlight"><pre><span></span>\s*</pre></div>\s*</div>\s*')


_TABLE = re.compile(r"<table\b.*?</table>", re.S)
_TH = re.compile(r"<th\b[^>]*>(.*?)</th>", re.S)
_TBODY = re.compile(r"<tbody>(.*?)</tbody>", re.S)
_TR = re.compile(r"<tr\b[^>]*>.*?</tr>", re.S)
_TAG = re.compile(r"<[^>]+>")


def label_table_cells(body: str) -> str:
    """Give each body cell of a headed table `data-label="<its column's header>"`, so the CSS can stack the
    table on a phone with every value still labelled."""

    def one_table(m: re.Match[str]) -> str:
        table = m.group(0)
        head = table.split("<tbody>", 1)[0]
        labels = [html.escape(html.unescape(_TAG.sub("", t)).strip(), quote=True) for t in _TH.findall(head)]
        if not labels:
            return table

        def one_row(r: re.Match[str]) -> str:
            parts = r.group(0).split("<td")
            cells = [f'<td data-label="{labels[i]}"{p}' if i < len(labels) and labels[i] else f"<td{p}"
                     for i, p in enumerate(parts[1:])]
            return parts[0] + "".join(cells)

        return _TBODY.sub(lambda b: "<tbody>" + _TR.sub(one_row, b.group(1)) + "</tbody>", table)

    return _TABLE.sub(one_table, body)


_NOTEBOOK_NUMBER = re.compile(r"(?:^|/)(\d\d)-(\d+)-[^/]*$")


def _page_meta(context: dict, body: str) -> str:
    """A description and a preview image for link previews (the page's first paragraph and first figure)."""
    title = html.escape(_TAG.sub("", html.unescape(str(context.get("title") or ""))), quote=True)
    desc = html.escape(describe_page(body) or str(context.get("docstitle") or ""), quote=True)
    fig = re.search(r'<figure class="pt215-figure".*?href="([^"]+\.png)"', body, re.S)
    pathto = context.get("pathto")
    image = fig.group(1) if fig else (pathto("_static/preview.png", 1) if pathto else "")
    tags = [f'<meta name="description" content="{desc}" />', f'<meta property="og:title" content="{title}" />',
            f'<meta property="og:description" content="{desc}" />', '<meta property="og:type" content="article" />',
            '<meta name="twitter:card" content="summary_large_image" />']
    if image:
        tags.append(f'<meta property="og:image" content="{html.escape(image, quote=True)}" />')
    return "\n".join(tags) + "\n"


def _math_renderer(app):
    """The build's MathJax-in-Node renderer (pt215.site.math_svg), or None where node or its MathJax is missing (the
    browser's MathJax then renders the TeX, as Sphinx set it up)."""
    if not hasattr(app, "pt215_math"):
        try:
            app.pt215_math = MathRenderer(Path(app.srcdir) / "_vendor" / ".mathjax-node" / "es5")
        except FileNotFoundError as e:
            from sphinx.util import logging

            logging.getLogger(__name__).info(f"pt215.site: math left to the browser's MathJax ({e})")
            app.pt215_math = None
    return app.pt215_math


def _on_page_context(app, pagename: str, templatename: str, context: dict, doctree) -> None:
    if "body" not in context:
        return
    renderer = _math_renderer(app)
    if renderer is not None:
        context["body"] = render_math(context["body"], renderer)
    m = _NOTEBOOK_NUMBER.search(pagename)
    label = f"{int(m.group(1))}.{int(m.group(2))}" if m else ""
    body = skipped_notes(_EMPTY_OUTPUT.sub("", context["body"]))
    context["body"] = break_names(number_figures(label_table_cells(body), label))
    context["metatags"] = str(context.get("metatags") or "") + _page_meta(context, context["body"])
    badge = badge_html(*page_stamp(Path(app.srcdir), pagename))
    if not badge:
        return
    body = context["body"]
    m = re.search(r"</h1>", body)
    context["body"] = body[: m.end()] + badge + body[m.end():] if m else badge + body


# What a page needs, recognised in its rendered body (MathJax: Sphinx math nodes not rendered to SVG at build
# time by pt215.site.math_svg, or TeX delimiters left in notebook outputs; the widget manager: embedded ipywidgets
# state or views).
_HAS_MATH = re.compile(r'class="math notranslate nohighlight(?![^"]*pt215-math)|\\\(|\\\[|\$\$')
_HAS_WIDGETS = re.compile(r"application/vnd\.jupyter\.widget-(?:view|state)\+json")


def _keep_own_static_files(app, config) -> None:
    """JB1 puts every .js/.css under every html_static_path folder on every page: keep only `_static`'s.

    `_vendor/` (MathJax with its lazily loaded parts, require.js, the widget manager) is only copied; Sphinx's
    math extension and myst-nb add the entry scripts to the pages that need them.
    """
    own = Path(app.srcdir) / "_static"

    def mine(entry: Any) -> bool:
        name = entry[0] if isinstance(entry, (tuple, list)) else entry
        return not isinstance(name, str) or "://" in name or (own / name).is_file()

    for key in ("html_js_files", "html_css_files"):
        entries = [e for e in config[key] if mine(e)]
        config[key] = [e for i, e in enumerate(entries) if e not in entries[:i]]


def _script_key(script: Any) -> tuple[str, str, str]:
    attrs = getattr(script, "attributes", {}) or {}
    name = getattr(script, "filename", script)  # Sphinx 7.4's _JavaScript (older Sphinx: a str subclass)
    return (str(name or ""), str(attrs.get("body", "")), str(attrs.get("type", "")))


def _page_scripts(app, pagename: str, templatename: str, context: dict, doctree) -> None:
    """Each script once (a second `const THEBE_JS_URL` is a SyntaxError); MathJax and the widget manager only
    on the pages whose body uses them."""
    scripts = context.get("script_files")
    body = context.get("body", "")
    if scripts is None:
        return
    math, widgets = bool(_HAS_MATH.search(body)), bool(_HAS_WIDGETS.search(body))
    seen: set[tuple[str, str, str]] = set()
    kept = []
    for script in scripts:
        key = _script_key(script)
        if key in seen:
            continue
        seen.add(key)
        src, inline = key[0].lower(), key[1]
        if not math and ("mathjax" in src or "window.MathJax" in inline):
            continue
        if not widgets and (src.endswith(("require.js", "embed-amd.js")) or "widget-state+json" in key[2]):
            continue
        kept.append(script)
    scripts[:] = kept


def figure_alt_texts(notebook: Path) -> dict[str, str]:
    """{sha256 of a PNG output: its alt text} for the figures of a notebook shown with `pt215.figures.show`.

    myst-nb names each image file after the sha256 of its bytes and reads no alt text from outputs; this is the
    bridge. The alt text is the output metadata's `alt` (`pt215.figures.show` writes it next to the PNG).
    """
    import base64
    import hashlib

    found: dict[str, str] = {}
    for cell in json.loads(notebook.read_text(encoding="utf-8")).get("cells", []):
        for out in cell.get("outputs", []):
            png = (out.get("data") or {}).get("image/png")
            alt = ((out.get("metadata") or {}).get("image/png") or {}).get("alt")
            if png and alt:
                data = base64.b64decode("".join(png) if isinstance(png, list) else png)
                found[hashlib.sha256(data).hexdigest()] = str(alt)
    return found


def _set_figure_alt(app, doctree) -> None:
    from docutils import nodes

    source = Path(app.srcdir) / (app.env.docname + ".ipynb")
    if not source.is_file():
        return
    alts = figure_alt_texts(source)
    for img in doctree.findall(nodes.image):
        stem = Path(str(img.get("uri", ""))).stem
        if stem in alts and not img.get("alt"):
            img["alt"] = alts[stem]


def _launch_buttons_from_book_config(app, config) -> None:
    """No button that points nowhere: the repository and launch buttons follow `repository.url` (pt215.site.config)."""
    config.html_theme_options = configure_launch_buttons(config.html_theme_options or {},
                                                         read_book_config(Path(app.srcdir)))
    # The theme's colour mode starts at "auto" (its default "" makes a first visit log "Got invalid theme mode: .").
    config.html_context = {"default_mode": "auto", **(config.html_context or {})}


DOWNLOAD = "_downloads/pytorch-2.15-in-practice.zip"
"""Where the whole book's zip lies in the built site (linked from every page's header: _templates)."""


def _build_download(app, exception) -> None:
    """When the HTML is done: the figures re-encoded lighter (pt215.site.images), then the whole book as one zip
    into the built site (scripts/build_download.py)."""
    if getattr(app, "pt215_math", None) is not None:
        app.pt215_math.close()
    if exception is not None or getattr(app.builder, "format", "") != "html":
        return
    import importlib.util

    from pt215.site.images import lighten_site_images

    lighten_site_images(Path(app.outdir) / "_images")
    script = Path(app.srcdir) / "scripts" / "build_download.py"
    spec = importlib.util.spec_from_file_location("build_download", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    target = Path(app.outdir) / DOWNLOAD
    if module.ZIP_NAME != target.name:
        raise RuntimeError(f"pt215.site: the header links {DOWNLOAD}, the script writes {module.ZIP_NAME}")
    module.build(Path(app.srcdir), target.parent)


def setup(app) -> dict[str, Any]:
    app.connect("build-finished", _build_download)
    app.connect("config-inited", _launch_buttons_from_book_config)
    app.connect("doctree-read", _set_figure_alt)
    app.connect("config-inited", _keep_own_static_files, priority=400)
    app.connect("html-page-context", _on_page_context)
    app.connect("html-page-context", _page_scripts, priority=900)
    workshop.register(app)  # the "Running a workshop" tables (agenda, hub sizing)
    hardware_runs.setup(app)  # {hardware-runs}: recorded pt215.verify runs
    page_figures.setup(app)  # {nb-figure}: a notebook's stored figure on a chapter page
    verdicts.setup(app)  # {verdicts}: every chapter's verdict table, on the at-a-glance page
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
