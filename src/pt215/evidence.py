"""Binding a chapter page's figures to the notebook output that measured them (every chapter page).

`glue(name, value)` records `value` in the cell's stored output exactly as myst-nb's `glue(..., display=False)`
does, without importing myst-nb (a notebook runs without the website toolchain). The chapter page then quotes it
with ``{glue:text}`NN-M-notebook::name``` (add a format spec, ``::name:.3f``, to round a number), so the page
and the stored output cannot disagree; a name the page uses but no notebook defines fails the website build
(`jupyter-book build -W`). A kernel-dependent value is glued as the string `pt215.cpu_kernels.kernel_value`
returns ('≈1.3479'), a timing in the `nbval-ignore-output` cell that prints it.
"""

from __future__ import annotations

import math
import re

__all__ = ["GLUE_PREFIX", "glue"]

GLUE_PREFIX = "application/papermill.record/"
"""The mime prefix myst-nb gives a glued value that is not displayed in the notebook itself."""
_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")


def glue(name: str, value: str | int | float) -> None:
    """Record `value` under `name` in this cell's output for the chapter page (myst-nb's glue format).

    `name` is lower-case letters, digits and '_' (unique within the notebook); `value` a str, int or finite float.
    """
    from IPython.display import display

    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"glue(): name must be lower-case letters, digits and '_' (a letter first), got {name!r}")
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"glue(): value must be a str, int or float, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"glue(): value must be finite, got {value!r}")
    display({GLUE_PREFIX + "text/plain": repr(value)}, raw=True,
            metadata={"scrapbook": {"name": name, "mime_prefix": GLUE_PREFIX}})
