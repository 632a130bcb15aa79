"""Diagrams drawn by code: boxes and arrows, sequence diagrams, timelines, bit layouts and cell grids (every chapter).

A mechanism (a protocol, a byte layout, a schedule) is drawn by a function of what the code did or of the format's
definition, so the picture stays true when the code changes. Each function returns `(fig, ax)` in the book's
style (`pt215.figures`); end the cell with `pt215.figures.show(alt)`:

    fig, ax = sequence(["rank 0", "rank 1"], [("msg", 0, 1, "put"), ("note", 1, "no recv posted")])
    show("Rank 0 writes into rank 1's memory; rank 1 posts nothing.")

Colours are `pt215.figures.COLORS` names (colour-blind safe); text stays at the book's sizes so it is legible on a
phone. Nothing here reads data: a diagram of a measurement is a plot of the run that measured it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pt215.figures import COLORS, use_style

__all__ = ["Span", "arrow", "bit_fields", "box", "canvas", "cell_grid", "color", "note", "sequence", "timeline"]


def color(name: str) -> str:
    """A palette colour by name (`pt215.figures.COLORS`), or a literal '#rrggbb'."""
    if isinstance(name, str) and name.startswith("#") and len(name) == 7:
        return name
    if name not in COLORS:
        raise ValueError(f"color: {name!r} is not one of {', '.join(COLORS)} (or '#rrggbb')")
    return COLORS[name]


def canvas(width: float = 7.0, height: float = 3.0, xlim: tuple[float, float] = (0, 10),
           ylim: tuple[float, float] = (0, 4)):
    """An empty drawing area in data units, without axes; width at most 7.5 in (the text column)."""
    import matplotlib.pyplot as plt

    if not 1 <= width <= 7.5 or not 0.5 <= height <= 10:
        raise ValueError(f"canvas: width must be in [1, 7.5] in and height in [0.5, 10] in, got {width}, {height}")
    use_style()
    fig, ax = plt.subplots(figsize=(width, height))
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.axis("off")
    return fig, ax


def box(ax, x: float, y: float, w: float, h: float, text: str = "", *, fill: str = "blue", edge: str = "black",
        alpha: float = 0.22, fontsize: float | None = None, bold: bool = False, rounded: bool = True):
    """A box with its lower-left corner at (x, y) and centred text; returns the patch."""
    from matplotlib.patches import FancyBboxPatch, Rectangle

    if w <= 0 or h <= 0:
        raise ValueError(f"box: w and h must be positive, got {w}, {h}")
    if rounded:
        pad = min(w, h) * 0.08
        patch = FancyBboxPatch((x + pad, y + pad), w - 2 * pad, h - 2 * pad, boxstyle=f"round,pad={pad}",
                               facecolor=color(fill), edgecolor=color(edge), linewidth=1.0)
        patch.set_facecolor((*_rgb(color(fill)), alpha))
    else:
        patch = Rectangle((x, y), w, h, facecolor=(*_rgb(color(fill)), alpha), edgecolor=color(edge), linewidth=0.8)
    ax.add_patch(patch)
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize,
                fontweight="bold" if bold else "normal")
    return patch


def _rgb(hex_color: str) -> tuple[float, float, float]:
    h = hex_color.lstrip("#")
    return tuple(int(h[i:i + 2], 16) / 255 for i in (0, 2, 4))  # type: ignore[return-value]


def arrow(ax, start: tuple[float, float], end: tuple[float, float], text: str = "", *, tone: str = "black",
          dashed: bool = False, both: bool = False, fontsize: float | None = None, text_at: float = 0.5,
          offset: tuple[float, float] = (0.0, 0.12)):
    """An arrow from `start` to `end`, with `text` placed at fraction `text_at` along it (shifted by `offset`)."""
    ax.annotate("", xy=end, xytext=start,
                arrowprops={"arrowstyle": "<->" if both else "-|>", "color": color(tone), "lw": 1.2,
                            "linestyle": "--" if dashed else "-", "shrinkA": 2, "shrinkB": 2})
    if text:
        x = start[0] + (end[0] - start[0]) * text_at + offset[0]
        y = start[1] + (end[1] - start[1]) * text_at + offset[1]
        ax.text(x, y, text, ha="center", va="bottom", fontsize=fontsize, color=color(tone))


def note(ax, x: float, y: float, text: str, *, tone: str = "black", fontsize: float | None = None,
         ha: str = "center", italic: bool = False):
    """Free text at (x, y)."""
    ax.text(x, y, text, ha=ha, va="center", fontsize=fontsize, color=color(tone),
            fontstyle="italic" if italic else "normal")


def sequence(actors: Sequence[str], steps: Sequence[tuple], *, width: float = 7.0, step_height: float = 0.45,
             title: str | None = None):
    """A sequence diagram: one lifeline per actor, time flowing down, one row per step.

    Steps: `("msg", src, dst, label)` an arrow between actors (indices or names), `("msg-", src, dst, label)` the
    same dashed (a reply, or something that may never come), `("self", actor, label)` an action on one lifeline,
    `("note", actor, label)` a remark beside a lifeline, `("span", label)` a row-wide label (a phase).
    """
    if not actors:
        raise ValueError("sequence: actors must name at least one participant")
    names = list(actors)

    def col(a) -> int:
        if isinstance(a, int) and 0 <= a < len(names):
            return a
        if a in names:
            return names.index(a)
        raise ValueError(f"sequence: {a!r} is not an actor (actors: {names})")

    n = len(steps)
    height = 0.9 + step_height * (n + 1)
    fig, ax = canvas(width, min(height, 10), xlim=(0, len(names)), ylim=(-(n + 1), 1.2))
    for i, name in enumerate(names):
        box(ax, i + 0.1, 0.35, 0.8, 0.7, name, fill="sky", bold=True)
        ax.plot([i + 0.5, i + 0.5], [0.35, -(n + 0.6)], color=COLORS["grey"], lw=1, ls=":", zorder=0)
    for row, step in enumerate(steps, start=1):
        kind, y = step[0], -row + 0.15
        if kind in ("msg", "msg-"):
            _, src, dst, label = step
            s, d = col(src), col(dst)
            arrow(ax, (s + 0.5, y), (d + 0.5, y), label, dashed=kind == "msg-", offset=(0, 0.05))
        elif kind == "self":
            _, a, label = step
            box(ax, col(a) + 0.12, y - 0.3, 0.76, 0.5, label, fill="orange", rounded=False)
        elif kind == "note":
            _, a, label = step
            c = col(a)
            right = c < len(names) - 1 or len(names) == 1
            note(ax, c + (0.56 if right else 0.44), y, label, ha="left" if right else "right", italic=True,
                 tone="vermillion")
        elif kind == "span":
            _, label = step
            ax.axhline(y - 0.05, color=COLORS["grey"], lw=0.6)
            note(ax, 0.02, y + 0.12, label, ha="left", italic=True)
        else:
            raise ValueError(f"sequence: step kind must be msg, msg-, self, note or span; got {kind!r}")
    if title:
        ax.set_title(title)
    return fig, ax


@dataclass(frozen=True)
class Span:
    """One bar of a timeline: on `lane`, from `start` to `end`, labelled, in a palette colour."""

    lane: int | str
    start: float
    end: float
    label: str = ""
    tone: str = "blue"
    hatch: str | None = None


def timeline(lanes: Sequence[str], spans: Sequence[Span], *, width: float = 7.0, lane_height: float = 0.5,
             xlabel: str = "time", title: str | None = None, legend: dict[str, str] | None = None):
    """A Gantt-style timeline: one row per lane (a rank, a stream, a thread), bars for what ran when.

    `legend` maps a palette colour name to what it means. Returns (fig, ax) with the time axis shown.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if not lanes:
        raise ValueError("timeline: lanes must name at least one row")
    names = list(lanes)
    use_style()
    fig, ax = plt.subplots(figsize=(width, min(10, 0.9 + lane_height * len(names) * 1.3)))
    for s in spans:
        if s.end < s.start:
            raise ValueError(f"timeline: span {s.label!r} ends before it starts ({s.start} > {s.end})")
        row = s.lane if isinstance(s.lane, int) else names.index(s.lane)
        y = len(names) - 1 - row
        ax.barh(y, s.end - s.start, left=s.start, height=0.7, color=color(s.tone), alpha=0.85,
                edgecolor="black", linewidth=0.5, hatch=s.hatch)
        if s.label:
            ax.text((s.start + s.end) / 2, y, s.label, ha="center", va="center", fontsize=8)
    ax.set_yticks(range(len(names)), list(reversed(names)))
    ax.set_xlabel(xlabel)
    ax.spines[["top", "right"]].set_visible(False)
    if title:
        ax.set_title(title)
    if legend:
        ax.legend(handles=[Patch(facecolor=color(c), label=t) for c, t in legend.items()], loc="upper center",
                  bbox_to_anchor=(0.5, -0.25), ncol=min(4, len(legend)), frameon=False)
    return fig, ax


def bit_fields(fields: Sequence[tuple[str, int, str]], *, bits: str | None = None, width: float = 6.0,
               title: str | None = None):
    """A bit layout, most significant bit on the left: fields `(name, n_bits, colour)`; `bits` the example value.

    `bits` is a string of '0'/'1' as long as all fields together (e.g. E2M1's "0110" = +3.0).
    """
    total = sum(n for _, n, _ in fields)
    if total <= 0 or any(n <= 0 for _, n, _ in fields):
        raise ValueError("bit_fields: every field needs a positive number of bits")
    if bits is not None and (len(bits) != total or set(bits) - {"0", "1"}):
        raise ValueError(f"bit_fields: bits must be {total} characters of 0/1, got {bits!r}")
    fig, ax = canvas(width, 1.6, xlim=(-0.2, total + 0.2), ylim=(-0.9, 1.4))
    pos = 0
    for name, n, tone in fields:
        for b in range(n):
            box(ax, pos + b, 0, 1, 1, bits[pos + b] if bits else "", fill=tone, rounded=False, alpha=0.35,
                fontsize=11)
        note(ax, pos + n / 2, -0.45, f"{name} ({n})", fontsize=9)
        pos += n
    for i in range(total):
        note(ax, i + 0.5, 1.18, str(total - 1 - i), fontsize=7, tone="grey")
    if title:
        ax.set_title(title)
    return fig, ax


def cell_grid(cells: Sequence[Sequence[str]], *, row_labels: Sequence[str] = (), col_labels: Sequence[str] = (),
              tones: Sequence[Sequence[str | None]] | None = None, width: float = 7.0, cell_height: float = 0.42,
              title: str | None = None, xlabel: str = "", fontsize: float = 8):
    """A grid of labelled cells (a schedule's time x rank table, a block table, a buffer's bytes).

    `tones[r][c]` is a palette colour name or None (an empty, white cell); `cells[r][c]` its text.
    """
    n_rows = len(cells)
    n_cols = max((len(r) for r in cells), default=0)
    if n_rows == 0 or n_cols == 0:
        raise ValueError("cell_grid: cells must have at least one row and one column")
    if tones is not None and (len(tones) != n_rows or any(len(t) != len(r) for t, r in zip(tones, cells, strict=True))):
        raise ValueError("cell_grid: tones must have the same shape as cells")
    left = 1.6 if row_labels else 0.1
    fig, ax = canvas(width, min(10, 0.8 + cell_height * (n_rows + (1 if col_labels else 0)) * 1.25),
                     xlim=(-left, n_cols + 0.1), ylim=(-0.4 if not xlabel else -1.0, n_rows + (0.9 if col_labels
                                                                                              else 0.2)))
    for r, row in enumerate(cells):
        y = n_rows - 1 - r
        for c, text in enumerate(row):
            tone = tones[r][c] if tones is not None else "sky"
            box(ax, c, y, 1, 1, text, fill=tone or "#ffffff", rounded=False, alpha=0.55 if tone else 1.0,
                fontsize=fontsize)
        if row_labels:
            note(ax, -0.1, y + 0.5, row_labels[r], ha="right", fontsize=9)
    for c, label in enumerate(col_labels):
        note(ax, c + 0.5, n_rows + 0.35, label, fontsize=8)
    if xlabel:
        note(ax, n_cols / 2, -0.55, xlabel, fontsize=9)
    if title:
        ax.set_title(title)
    return fig, ax
