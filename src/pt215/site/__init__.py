"""The book's website: everything only the Sphinx build uses (`_config.yml` lists `pt215.site` as an extension).

- :mod:`pt215.site.extension`: the Sphinx hooks and `setup` (page badges, figures, skipped cells, math, scripts,
  the download);
- :mod:`pt215.site.stamps`: a chapter page's hardware badge and "last verified" stamp;
- :mod:`pt215.site.page_html`, :mod:`pt215.site.math_svg`: what the build does to a page's HTML and math;
- :mod:`pt215.site.config`: the book's settings in `_config.yml` (launch buttons, the notebooks' setup cell);
- :mod:`pt215.site.hardware_runs`: the `{hardware-runs}` directive (recorded `python -m pt215.verify` runs);
- :mod:`pt215.site.workshop`, :mod:`pt215.site.agenda`: the "Running a workshop" pages' tables;
- :mod:`pt215.site.page_figures`: `{nb-figure}`, a notebook's stored figure on a chapter page;
- :mod:`pt215.site.verdicts`: the chapters' verdict tables and `{verdicts}`, which gathers them.

No module a reader imports (anything outside this folder) imports `pt215.site`, and importing it imports no
torch (tests/test_book_ext.py checks both).
"""

from __future__ import annotations

from pt215.site.extension import setup

__all__ = ["setup"]
