"""pt215.site, the website's code: the hardware badge and "last verified" stamp come from files, not hand-typed
text; what the build does to a page's HTML; and the package stays the website's own (no reader module imports
it, importing it imports no torch)."""

from __future__ import annotations

import ast
import base64
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

from pt215.site.extension import figure_alt_texts, label_table_cells
from pt215.site.stamps import Stamp, badge_html, page_stamp, read_front_matter, stamp_line

SRC = Path(__file__).resolve().parents[1] / "src" / "pt215"


def write_nb(path: Path, meta: dict) -> None:
    path.write_text(json.dumps({"cells": [], "metadata": {"pt215": meta}, "nbformat": 4, "nbformat_minor": 5}))


def test_page_stamps(tmp_path):
    ch = tmp_path / "chapters" / "09-x"
    ch.mkdir(parents=True)
    (ch / "index.md").write_text('---\npt215:\n  needs: "CPU: all"\n---\n# X\n')
    v = {"torch": "2.15.0", "hardware": "CPU x86_64, 2 cores, no CUDA GPU", "date": "2026-11-29"}
    write_nb(ch / "01-a.ipynb", {"needs": "CPU", "verified": v})
    assert read_front_matter(ch / "index.md") == {"pt215": {"needs": "CPU: all"}}
    needs, stamps = page_stamp(tmp_path, "chapters/09-x/index")
    assert needs == "CPU: all" and stamps == [Stamp("01-a", "2.15.0", "CPU x86_64, 2 cores, no CUDA GPU", "2026-11-29")]
    assert stamps[0].text() == "01-a: torch 2.15.0 · CPU x86_64, 2 cores, no CUDA GPU · 2026-11-29"
    needs, stamps = page_stamp(tmp_path, "chapters/09-x/01-a")
    assert needs == "CPU" and stamps == [Stamp(None, "2.15.0", "CPU x86_64, 2 cores, no CUDA GPU", "2026-11-29")]
    assert page_stamp(tmp_path, "intro") == (None, [])
    html = badge_html("a < b", [Stamp(None, "2.15.0", "CPU: x < y", "d")])
    assert "a &lt; b" in html and "Last verified: torch 2.15.0 · CPU: x &lt; y · d" in html
    assert badge_html(None, []) == ""


def test_chapter_stamps_collapse_when_they_agree():
    same = [Stamp("01-a", "2.15.0", "CPU x86_64", "2026-11-29"), Stamp("02-b", "2.15.0", "CPU x86_64", "2026-12-01")]
    assert stamp_line(same) == "torch 2.15.0 · CPU x86_64 · 2026-11-29 to 2026-12-01"
    assert stamp_line(same[:1]) == "torch 2.15.0 · CPU x86_64 · 2026-11-29"
    differ = [Stamp("01-a", "2.15.0", "CPU", "d"), Stamp("02-b", "2.14.0", "CPU", "d")]
    assert stamp_line(differ) is None
    html = badge_html(None, differ)
    assert "01-a: torch 2.15.0 · CPU · d<br>02-b: torch 2.14.0 · CPU · d" in html
    assert Stamp.from_metadata({"torch": "2.15.0"}, "01-a").text() == "01-a: torch 2.15.0 · ? · ?"


def test_empty_live_output_placeholders_are_dropped():
    from pt215.site.extension import _EMPTY_OUTPUT

    head = '<div class="output text_plain highlight-myst-ansi notranslate"><div class="highlight"><pre><span></span>'
    empty = head + "\n</pre></div>\n</div>\n"
    full = head + "x\n</pre></div>\n</div>\n"
    assert _EMPTY_OUTPUT.sub("", empty + full) == full


def test_figures_are_numbered_and_captioned():
    from pt215.site.page_html import number_figures

    img = ('<a class="reference internal image-reference" href="../../_images/ab.png"><img alt="Busbw against message '
           'size for four ranks" src="../../_images/ab.png" style="width: 760px;" />\n</a>')
    out = number_figures(img + img, "2.3")
    assert out.count("<figure") == 2 and "Figure 2.3.1.</span> Busbw against" in out and "Figure 2.3.2." in out
    assert "--pt215-fig-w: 760px" in out and "Tap or click the figure to open it full size." in out
    assert 'href="../../_images/ab.png"' in out and 'alt="Busbw against' in out
    assert "Figure 1." in number_figures(img, "")


def test_skipped_lines_become_notes_and_expected_values_say_so():
    from pt215.site.page_html import skipped_notes

    head = '<div class="output stream highlight-myst-ansi notranslate"><div class="highlight"><pre><span></span>'
    line = ("[skipped] needs a CUDA GPU; this machine has no CUDA GPU. This cell would have shown varlen_attn vs the "
            "CPU reference, max error ~1e-2 (bf16).")
    only = skipped_notes(head + line + "\n</pre></div>\n</div>\n")
    assert "<pre>" not in only and 'class="admonition note pt215-skipped"' in only
    assert "Needs a CUDA GPU</p>" in only and "max error ~1e-2 (expected value) (bf16)." in only
    assert "this machine" not in only
    mixed = skipped_notes(head + line + "\nFP8 matmuls run on: cpu\n</pre></div>\n</div>\n")
    assert "pt215-skipped" in mixed and "<pre><span></span>FP8 matmuls run on: cpu\n</pre>" in mixed
    gil = skipped_notes(head + "[skipped] needs a free-threaded Python (3.14t); this one has the GIL. This "
                              "cell would have shown the GIL staying disabled.\n</pre></div>\n</div>\n")
    assert "Needs a free-threaded Python (3.14t)</p>" in gil and "shows the GIL staying disabled." in gil
    odd = skipped_notes(head + "[skipped] no fabric here\n</pre></div>\n</div>\n")
    assert "Needs other hardware</p><p>no fabric here</p>" in odd and "<pre>" not in odd
    plain = head + "result: 4\n</pre></div>\n</div>\n"
    assert skipped_notes(plain) == plain


def test_code_names_break_only_after_separators():
    from pt215.site.page_html import break_names

    out = break_names('<span class="pre">TORCH_FR_BUFFER_SIZE</span> <span class="pre">short_name</span>')
    assert out.startswith('<span class="pre">TORCH_<wbr>FR_<wbr>BUFFER_<wbr>SIZE</span>')
    assert '<span class="pre">short_name</span>' in out  # under 16 characters: left alone
    assert "_<wbr>watchdog" not in break_names('<span class="pre">torch/distributed/_watchdog.py</span>')


def test_page_description_is_the_first_real_paragraph():
    from pt215.site.page_html import describe_page

    body = "<h1>T</h1><p>Short.</p><p>The fifth lab case runs on <code>4</code> ranks arranged in two pairs.</p>"
    assert describe_page(body) == "The fifth lab case runs on 4 ranks arranged in two pairs."
    long = "<p>" + "word " * 100 + "</p>"
    assert describe_page(long).endswith("…") and len(describe_page(long)) <= 200
    assert describe_page("<p>tiny</p>") == ""


def test_math_is_rendered_to_svg_at_build_time():
    import shutil

    import pytest

    from pt215.site.math_svg import MathRenderer, render_math

    es5 = Path(__file__).resolve().parents[1] / "_vendor" / ".mathjax-node" / "es5"
    if not shutil.which("node") or not es5.is_dir():
        pytest.skip("needs node and scripts/vendor_js.sh's MathJax (README command 1)")
    renderer = MathRenderer(es5)
    try:
        body = ('<p><span class="math notranslate nohighlight">\\(n &lt; 4\\)</span></p>'
                '<div class="math notranslate nohighlight">\n\\[\\frac{S}{t}\\]</div>')
        out = render_math(body, renderer)
        assert out.count("<mjx-container") == 2 and 'display="true"' in out and "\\(" not in out
        assert 'aria-label="n &lt; 4"' in out and "pt215-math" in out
        # each glyph defined once for the page, every <use> pointing at a definition that exists
        twice = render_math(body + '<p><span class="math notranslate nohighlight">\\(n + S\\)</span></p>', renderer)
        ids = re.findall(r'<path id="([^"]+)"', twice)
        uses = set(re.findall(r'xlink:href="#([^"]+)"', twice))
        assert len(ids) == len(set(ids)) and uses <= set(ids) and all(i.startswith("pt215-mjx-") for i in ids)
        with pytest.raises(ValueError, match="TeX error"):
            renderer.render("\\frac{", False)
    finally:
        renderer.close()


def test_mathjax_only_where_math_is_left_to_the_browser():
    from pt215.site.extension import _HAS_MATH

    assert _HAS_MATH.search('<span class="math notranslate nohighlight">\\(x\\)</span>')
    assert not _HAS_MATH.search('<span class="math notranslate nohighlight pt215-math"><mjx-container>')


def test_alt_texts_come_from_output_metadata(tmp_path):
    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 30
    nb = {"cells": [{"cell_type": "code", "outputs": [{"output_type": "display_data",
          "data": {"image/png": base64.b64encode(png).decode(), "text/plain": "A line rising to 2."},
          "metadata": {"image/png": {"alt": "A line rising to 2.", "width": "480px"}}}]}]}
    path = tmp_path / "01-x.ipynb"
    path.write_text(json.dumps(nb))
    assert figure_alt_texts(path) == {hashlib.sha256(png).hexdigest(): "A line rising to 2."}


def test_table_cells_get_their_column_label():
    t = ('<table class="table"><thead><tr><th class="head"><p>A &amp; b</p></th><th class="head"><p>B</p></th>'
         '</tr></thead><tbody><tr class="row-even"><td><p>1</p></td><td><p>2</p></td></tr></tbody></table>')
    out = label_table_cells(t)
    assert '<td data-label="A &amp; b"><p>1</p></td><td data-label="B"><p>2</p></td>' in out
    assert label_table_cells("<table><tbody><tr><td>x</td></tr></tbody></table>").count("data-label") == 0



# ------------------------------------------------------------------------------- the package is the website's


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_no_reader_module_imports_the_website_package():
    readers = sorted(SRC.glob("*.py"))
    assert len(readers) > 20
    offenders = {p.name: sorted(n for n in _imports(p) if n == "pt215.site" or n.startswith("pt215.site."))
                 for p in readers}
    assert not {k: v for k, v in offenders.items() if v}, offenders


def test_importing_the_website_package_imports_no_torch():
    code = "import pt215.site, pt215.site.hardware_runs, sys; assert 'torch' not in sys.modules, 'torch imported'"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


def test_site_figures_are_lighter_and_the_same_picture():
    """pt215.site.images: an opaque plot re-encoded with a palette is smaller and the same picture (a mean error
    under one level of 255, under 0.1 % of pixels off by more than 32); a transparent PNG is left as it is."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image, ImageChops

    from pt215.site.images import lighten_png

    fig, ax = plt.subplots(figsize=(4, 3))
    for k in range(4):
        ax.plot(range(50), [(i * (k + 1)) % 17 for i in range(50)], lw=2)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=144, facecolor="white")
    plt.close(fig)
    data = buf.getvalue()
    light = lighten_png(data)
    assert len(light) < 0.7 * len(data)
    a, b = (Image.open(io.BytesIO(x)).convert("RGB") for x in (data, light))
    assert a.size == b.size
    diff = ImageChops.difference(a, b).convert("L")
    assert sum(diff.getdata()) / (a.size[0] * a.size[1]) < 1.0  # mean error under 1 level of 255
    assert sum(1 for v in diff.getdata() if v > 32) < 0.001 * a.size[0] * a.size[1]
    see_through = io.BytesIO()
    Image.new("RGBA", (8, 8), (255, 0, 0, 0)).save(see_through, format="PNG")
    assert lighten_png(see_through.getvalue()) == see_through.getvalue()
