"""pt215.book: the hardware badge and "last verified" stamp come from files, not hand-typed text."""

from __future__ import annotations

import json
from pathlib import Path

from pt215.book import _badge_html, page_stamp, read_front_matter


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
    assert needs == "CPU: all" and stamps == ["01-a: torch 2.15.0 · CPU x86_64, 2 cores, no CUDA GPU · 2026-11-29"]
    needs, stamps = page_stamp(tmp_path, "chapters/09-x/01-a")
    assert needs == "CPU" and len(stamps) == 1
    assert page_stamp(tmp_path, "intro") == (None, [])
    html = _badge_html("a < b", ["s"])
    assert "a &lt; b" in html and "Last verified: s" in html
    assert _badge_html(None, []) == ""


def test_empty_live_output_placeholders_are_dropped():
    from pt215.book import _EMPTY_OUTPUT

    head = '<div class="output text_plain highlight-myst-ansi notranslate"><div class="highlight"><pre><span></span>'
    empty = head + "\n</pre></div>\n</div>\n"
    full = head + "x\n</pre></div>\n</div>\n"
    assert _EMPTY_OUTPUT.sub("", empty + full) == full


def test_figures_are_numbered_and_captioned():
    from pt215.book_html import number_figures

    img = ('<a class="reference internal image-reference" href="../../_images/ab.png"><img alt="Busbw against message '
           'size for four ranks" src="../../_images/ab.png" style="width: 760px;" />\n</a>')
    out = number_figures(img + img, "2.3")
    assert out.count("<figure") == 2 and "Figure 2.3.1.</span> Busbw against" in out and "Figure 2.3.2." in out
    assert "--pt215-fig-w: 760px" in out and "Tap or click the figure to open it full size." in out
    assert 'href="../../_images/ab.png"' in out and 'alt="Busbw against' in out
    assert "Figure 1." in number_figures(img, "")


def test_skipped_lines_become_notes_and_expected_values_say_so():
    from pt215.book_html import skipped_notes

    head = '<div class="output stream highlight-myst-ansi notranslate"><div class="highlight"><pre><span></span>'
    line = ("[skipped] needs a CUDA GPU; this machine has no CUDA GPU. This cell would have shown varlen_attn vs the "
            "CPU reference, max error ~1e-2 (bf16).")
    only = skipped_notes(head + line + "\n</pre></div>\n</div>\n")
    assert "<pre>" not in only and 'class="admonition note pt215-skipped"' in only
    assert "Needs a CUDA GPU</p>" in only and "max error ~1e-2 (expected value) (bf16)." in only
    assert "this machine" not in only
    mixed = skipped_notes(head + line + "\nFP8 matmuls run on: cpu\n</pre></div>\n</div>\n")
    assert "pt215-skipped" in mixed and "<pre><span></span>FP8 matmuls run on: cpu\n</pre>" in mixed
    gil = skipped_notes(head + "[skipped] needs a free-threaded Python (3.13t or later); this one has the GIL. This "
                              "cell would have shown the GIL staying disabled.\n</pre></div>\n</div>\n")
    assert "Needs a free-threaded Python (3.13t or later)</p>" in gil and "shows the GIL staying disabled." in gil
    odd = skipped_notes(head + "[skipped] no fabric here\n</pre></div>\n</div>\n")
    assert "Needs other hardware</p><p>no fabric here</p>" in odd and "<pre>" not in odd
    plain = head + "result: 4\n</pre></div>\n</div>\n"
    assert skipped_notes(plain) == plain


def test_code_names_break_only_after_separators():
    from pt215.book_html import break_names

    out = break_names('<span class="pre">TORCH_FR_BUFFER_SIZE</span> <span class="pre">short_name</span>')
    assert out.startswith('<span class="pre">TORCH_<wbr>FR_<wbr>BUFFER_<wbr>SIZE</span>')
    assert '<span class="pre">short_name</span>' in out  # under 16 characters: left alone
    assert "_<wbr>watchdog" not in break_names('<span class="pre">torch/distributed/_watchdog.py</span>')


def test_page_description_is_the_first_real_paragraph():
    from pt215.book_html import describe_page

    body = "<h1>T</h1><p>Short.</p><p>The fifth lab case runs on <code>4</code> ranks arranged in two pairs.</p>"
    assert describe_page(body) == "The fifth lab case runs on 4 ranks arranged in two pairs."
    long = "<p>" + "word " * 100 + "</p>"
    assert describe_page(long).endswith("…") and len(describe_page(long)) <= 200
    assert describe_page("<p>tiny</p>") == ""


def test_math_is_rendered_to_svg_at_build_time():
    import shutil

    import pytest

    from pt215.book_math import MathRenderer, render_math

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
        with pytest.raises(ValueError, match="TeX error"):
            renderer.render("\\frac{", False)
    finally:
        renderer.close()


def test_mathjax_only_where_math_is_left_to_the_browser():
    from pt215.book import _HAS_MATH

    assert _HAS_MATH.search('<span class="math notranslate nohighlight">\\(x\\)</span>')
    assert not _HAS_MATH.search('<span class="math notranslate nohighlight pt215-math"><mjx-container>')
