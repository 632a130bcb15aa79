"""Show a matplotlib figure with its alt text, sized for the book's text column (every chapter's figures).

``show(alt)`` replaces ``plt.show()`` in the notebooks: it renders the current figure once, as a PNG whose
``text/plain`` is the alt text (what a screen reader or a text-only viewer gets instead of
``<Figure size 640x480 with 1 Axes>``) and whose output metadata carries ``alt`` and a display ``width``. The
website's Sphinx extension (:mod:`pt215.site`) puts that alt text on the ``<img>``; the page's CSS scales the
image down to the column (and onto a light card in dark mode).
"""

from __future__ import annotations

import base64
import io

__all__ = ["show", "COLUMN_PX", "DPI"]

COLUMN_PX = 760
"""Width of the book's text column on a laptop (sphinx-book-theme at 1366 px): the largest display width."""
DPI = 144
"""Pixels per inch of the stored PNG: a 5.3-inch-wide figure fills the column at 1:1 on a 2x (retina) screen."""


def show(alt: str, fig=None) -> None:
    """Display ``fig`` (default: the current figure) with alt text ``alt``, then close it.

    ``alt`` says what the figure shows (the axes, what is plotted, the point it makes), in one or two
    sentences; a file name or an empty string is refused.
    """
    import matplotlib.pyplot as plt
    from IPython.display import display

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
    display({"image/png": base64.b64encode(png).decode("ascii"), "text/plain": alt.strip()}, raw=True,
            metadata={"image/png": {"alt": alt.strip(), "width": f"{css_width}px"}})
