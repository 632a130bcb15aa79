"""The built site's figures made lighter: each opaque PNG in `_images/` re-encoded with at most 256 colours.

The book's figures are matplotlib plots and code-drawn diagrams on white (pt215.figures): flat colours and
anti-aliased edges, which a 256-colour palette holds without a visible change, at about 40 % of the bytes. A PNG
with transparent pixels, or one whose palette copy would not be smaller, is left as it is. The notebooks keep
their full-colour outputs; only the website's copies change.
"""

from __future__ import annotations

import io
from pathlib import Path

__all__ = ["lighten_png", "lighten_site_images"]


def lighten_png(data: bytes) -> bytes:
    """`data` (a PNG) as a 256-colour PNG when that is smaller and the image has no transparent pixel; else `data`."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        if im.format != "PNG" or im.mode == "P":
            return data
        if "A" in im.getbands() and im.getchannel("A").getextrema()[0] < 255:
            return data
        rgb = im.convert("RGB")
    palette = rgb.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    out = io.BytesIO()
    palette.save(out, format="PNG", optimize=True)
    return out.getvalue() if out.tell() < len(data) else data


def lighten_site_images(images: Path) -> tuple[int, int]:
    """Re-encode every PNG under `images` in place (lighten_png); returns (bytes before, bytes after)."""
    before = after = 0
    for path in sorted(Path(images).glob("*.png")):
        data = path.read_bytes()
        light = lighten_png(data)
        before, after = before + len(data), after + len(light)
        if light is not data:
            path.write_bytes(light)
    return before, after
