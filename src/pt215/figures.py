"""The book's figure style and `show`: a matplotlib figure with its alt text, sized for the text column (every chapter).

``show(alt)`` replaces ``plt.show()`` in the notebooks: it renders the current figure once, as a PNG whose
``text/plain`` is the alt text (what a screen reader or a text-only viewer gets instead of
``<Figure size 640x480 with 1 Axes>``) and whose output metadata carries ``alt`` and a display ``width``. The
website's Sphinx extension (:mod:`pt215.site`) puts that alt text on the ``<img>``; the page's CSS scales the
image down to the column (and onto a light card in dark mode). ``show(alt, name="...")`` also names the figure so
a chapter page can show the same stored PNG with ``{nb-figure} NOTEBOOK.ipynb::name`` (`pt215.site.page_figures`).

``use_style()`` is the one style: the Okabe-Ito palette (`COLORS`, distinguishable with every common colour-vision
deficiency), 10 pt text (legible at a phone's 0.45 scale of a 144 dpi PNG), light grids, no top and right spines.
Diagrams of mechanisms are drawn in the same style by `pt215.diagrams`.
"""

from __future__ import annotations

import base64
import io
import re

__all__ = ["show", "use_style", "COLORS", "CYCLE", "COLUMN_PX", "DPI"]

COLORS: dict[str, str] = {
    "blue": "#0072B2", "orange": "#E69F00", "green": "#009E73", "vermillion": "#D55E00", "sky": "#56B4E9",
    "purple": "#CC79A7", "yellow": "#F0E442", "grey": "#999999", "black": "#000000",
}
"""The Okabe-Ito palette by name: safe for protanopia, deuteranopia and tritanopia, and in greyscale by order."""
CYCLE = ("blue", "orange", "green", "vermillion", "purple", "sky", "grey", "yellow")
"""The order lines and bars take their colours in."""
_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")

COLUMN_PX = 760
"""Width of the book's text column on a laptop (sphinx-book-theme at 1366 px): the largest display width."""
DPI = 144
"""Pixels per inch of the stored PNG: a 5.3-inch-wide figure fills the column at 1:1 on a 2x (retina) screen."""


def use_style() -> None:
    """Set the book's matplotlib style (palette, sizes, grid); idempotent, cheap, safe to call in every cell."""
    import matplotlib as mpl
    from cycler import cycler

    mpl.rcParams.update({
        "axes.prop_cycle": cycler(color=[COLORS[c] for c in CYCLE]),
        "font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "xtick.labelsize": 9, "ytick.labelsize": 9,
        "legend.fontsize": 9, "figure.titlesize": 11,
        "axes.spines.top": False, "axes.spines.right": False,
        "axes.grid": True, "grid.color": "#dddddd", "grid.linewidth": 0.6, "axes.axisbelow": True,
        "figure.dpi": 100, "savefig.dpi": DPI, "figure.figsize": (6.4, 3.6),
        "lines.linewidth": 1.8, "lines.markersize": 5,
    })


def show(alt: str, fig=None, *, name: str | None = None) -> None:
    """Display ``fig`` (default: the current figure) with alt text ``alt``, then close it.

    ``alt`` says what the figure shows (the axes, what is plotted, the point it makes), in one or two
    sentences; a file name or an empty string is refused. ``name`` (lower-case letters, digits, '_') lets a
    chapter page show this stored figure (``{nb-figure} NOTEBOOK.ipynb::name``).
    """
    import matplotlib.pyplot as plt
    from IPython.display import display

    if name is not None and (not isinstance(name, str) or not _NAME.match(name)):
        raise ValueError(f"name must be lower-case letters, digits and '_' (a letter first), got {name!r}")
    if not isinstance(alt, str) or len(alt.strip()) < 15:
        raise ValueError(f"alt must be a sentence describing the figure (>= 15 characters), got {alt!r}")
    if alt.strip().lower().endswith((".png", ".svg", ".jpg")):
        raise ValueError(f"alt must describe the figure, not name a file: {alt!r}")
    fig = plt.gcf() if fig is None else fig
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight", facecolor="white",
                metadata={"Software": None})  # no matplotlib version in the bytes
    plt.close(fig)
    png = buf.getvalue()
    width_px = int.from_bytes(png[16:20], "big")  # IHDR width
    css_width = min(COLUMN_PX, round(width_px * 96 / DPI * 1.15))
    metadata: dict[str, object] = {"image/png": {"alt": alt.strip(), "width": f"{css_width}px"}}
    if name is not None:
        metadata["pt215_figure"] = name
    display({"image/png": base64.b64encode(png).decode("ascii"), "text/plain": alt.strip()}, raw=True,
            metadata=metadata)
