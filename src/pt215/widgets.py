"""Interactive widgets that compute in the reader's browser: they work on the website, with no kernel.

Each function returns an ``IPython.display.HTML`` object: a small form plus a script that redoes the cell's
arithmetic in JavaScript. Used by chapter 0 ("Before you start": the all-reduce bus-bandwidth factor) and
chapter 5 ("The NVFP4 format": the block explorer, a port of :func:`pt215.nvfp4.quantize` for one block of
16 that the site test checks against the tables printed by Python). The HTML is deterministic (no random
ids), so nbval compares it like any other output.
"""

from __future__ import annotations

import hashlib
import html
import json
from collections.abc import Mapping, Sequence

__all__ = ["busbw_factor_slider", "nvfp4_block_explorer"]


def _uid(kind: str, payload: str) -> str:
    """A stable element id (same input, same id), unique per widget on a page."""
    return f"pt215-{kind}-{hashlib.sha256(payload.encode()).hexdigest()[:10]}"


def _html(markup: str):
    from IPython.display import HTML

    return HTML(markup)


def busbw_factor_slider(value: int = 4, lo: int = 2, hi: int = 64):
    """A slider for the rank count n and the all-reduce bus-bandwidth factor 2(n-1)/n it gives (chapter 0).

    The factor is shown with three decimals, as Python's ``f"{x:.3f}"`` prints it.
    """
    for name, v in (("value", value), ("lo", lo), ("hi", hi)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if not 2 <= lo <= value <= hi:
        raise ValueError(f"need 2 <= lo <= value <= hi, got lo={lo}, value={value}, hi={hi}")
    uid = _uid("busbw", f"{value},{lo},{hi}")
    factor = 2 * (value - 1) / value
    return _html(f"""<div class="pt215-widget" id="{uid}">
<label for="{uid}-n">ranks n</label>
<input type="range" id="{uid}-n" min="{lo}" max="{hi}" step="1" value="{value}" aria-describedby="{uid}-out">
<output id="{uid}-nval" for="{uid}-n">{value}</output>
<div id="{uid}-out" aria-live="polite">2(n-1)/n = <b>{factor:.3f}</b></div>
<script>(function () {{
  var n = document.getElementById("{uid}-n"), nv = document.getElementById("{uid}-nval"),
      out = document.getElementById("{uid}-out");
  function show() {{
    var k = parseInt(n.value, 10);
    nv.textContent = k;
    out.innerHTML = "2(n-1)/n = <b>" + (2 * (k - 1) / k).toFixed(3) + "</b>";
  }}
  n.addEventListener("input", show);
  show();
}})();</script>
</div>""")


# The JavaScript half of nvfp4_block_explorer: pt215.nvfp4.quantize for one block with g computed from the block,
# in float32 (Math.fround after every operation, as torch does), and Python's number formatting.
_NVFP4_JS = r"""
(function (root) {
  var f = Math.fround, GRID = [0, 0.5, 1, 1.5, 2, 3, 4, 6], DOWN = [0.25, 1.25, 2.5, 5], UP = [0.75, 1.75, 3.5];
  function e4m3(v) {  // round a float32 in [2**-6, 448] to the nearest e4m3 value, ties to even
    var e = Math.floor(Math.log2(v));
    if (Math.pow(2, e) > v) e -= 1; else if (Math.pow(2, e + 1) <= v) e += 1;
    var step = Math.pow(2, e - 3), q = v / step, r = Math.round(q);
    if (Math.abs(q - Math.trunc(q)) === 0.5) { r = Math.floor(q); if (r % 2) r += 1; }
    return Math.min(r * step, 448);
  }
  function encode(y) {
    var a = Math.abs(y), c = 0, i;
    for (i = 0; i < DOWN.length; i++) if (a > DOWN[i]) c++;
    for (i = 0; i < UP.length; i++) if (a >= UP[i]) c++;
    return (y < 0 || Object.is(y, -0)) ? c | 8 : c;
  }
  function roundHalfEven(v, d) {  // v.toFixed(d), but an exact tie goes to the even digit (Python's format)
    var s = Math.abs(v).toFixed(d + 25), head = s.slice(0, s.length - 25).replace(/\.$/, "");
    if (/^50*$/.test(s.slice(s.length - 25)) && parseInt(head.slice(-1), 10) % 2 === 0) return head;
    return Math.abs(v).toFixed(d);
  }
  function fixed(v, d, width, plus) {  // Python f"{v:+W.Df}" / f"{v:W.Df}"
    var s = roundHalfEven(v, d), neg = v < 0 || Object.is(v, -0);
    if (neg) s = "-" + s; else if (plus) s = "+" + s;
    while (s.length < width) s = " " + s;
    return s;
  }
  function general(v, p) {  // Python f"{v:.Pg}"
    if (v === 0) return "0";
    var m = v.toExponential(p - 1).split("e"), exp = parseInt(m[1], 10), s;
    if (exp >= -4 && exp < p) {
      s = roundHalfEven(v, Math.max(p - 1 - exp, 0));
      if (s.indexOf(".") >= 0) s = s.replace(/0+$/, "").replace(/\.$/, "");
      return (v < 0 ? "-" : "") + s;
    }
    var mant = m[0].indexOf(".") >= 0 ? m[0].replace(/0+$/, "").replace(/\.$/, "") : m[0];
    return mant + "e" + (exp < 0 ? "-" : "+") + (Math.abs(exp) < 10 ? "0" : "") + Math.abs(exp);
  }
  function explain(vals) {
    var x = vals.map(f), amax = 0, i;
    for (i = 0; i < 16; i++) amax = Math.max(amax, Math.abs(x[i]));
    var g = f(amax / 2688); if (g === 0) g = 1;
    var t = f(f(amax / 6) / g), s8 = e4m3(Math.min(Math.max(t, Math.pow(2, -6)), 448));
    var recip = f(f(1 / g) / s8), gs = f(g * s8);
    var lines = ["per_tensor_scale g = " + general(g, 6) + "   block scale (e4m3) = " + general(s8, 6),
                 "  i        x   code  e2m1    x_hat    error"];
    var num = 0, den = 0;
    for (i = 0; i < 16; i++) {
      var y = Math.min(Math.max(f(x[i] * recip), -6), 6), c = encode(y);
      var e = (c & 8) ? -GRID[c & 7] : GRID[c & 7], r = f(e * gs), d = f(r - x[i]);
      num += d * d; den += x[i] * x[i];
      var idx = String(i); while (idx.length < 3) idx = " " + idx;
      var code = String(c); while (code.length < 4) code = " " + code;
      lines.push(idx + " " + fixed(x[i], 4, 8, true) + "   " + code + "  " + fixed(e, 1, 4, true) + " " +
                 fixed(r, 4, 8, true) + " " + fixed(r - x[i], 4, 8, true));
    }
    var rel = f(f(Math.sqrt(num)) / Math.max(f(Math.sqrt(den)), 1e-30));
    lines.push("relative error ||x_hat - x|| / ||x|| = " + fixed(rel, 4, 0, false));
    return lines.join("\n");
  }
  root.pt215Nvfp4Explain = explain;
})(window);
"""


def nvfp4_block_explorer(presets: Mapping[str, Sequence[float]], initial: str | None = None):
    """A preset menu, a box of 16 editable values and the NVFP4 table for them (chapter 5, "The NVFP4 format").

    ``presets`` maps a name to 16 numbers (a list or a 1-d tensor). The table is the one
    ``explain(block)`` prints in that notebook: codes, e2m1 values, reconstruction and error per element.
    """
    if not presets:
        raise ValueError("presets must name at least one block of 16 values")
    texts = {}
    for name, block in presets.items():
        vals = [float(v) for v in (block.tolist() if hasattr(block, "tolist") else block)]
        if len(vals) != 16:
            raise ValueError(f"presets[{name!r}] must hold 16 values (one NVFP4 block), got {len(vals)}")
        texts[str(name)] = {"text": ", ".join(f"{v:.4g}" for v in vals), "values": vals}
    initial = next(iter(texts)) if initial is None else initial
    if initial not in texts:
        raise ValueError(f"initial must be one of {list(texts)}, got {initial!r}")
    data = json.dumps(texts).replace("</", "<\\/")
    uid = _uid("nvfp4", data + initial)
    options = "".join(f'<option value="{html.escape(k)}"{" selected" if k == initial else ""}>{html.escape(k)}'
                      f"</option>" for k in texts)
    return _html(f"""<div class="pt215-widget" id="{uid}">
<label for="{uid}-preset">preset</label> <select id="{uid}-preset">{options}</select>
<label for="{uid}-values" style="display:block;margin-top:.4rem">16 values</label>
<textarea id="{uid}-values" rows="3" spellcheck="false">{html.escape(texts[initial]["text"])}</textarea>
<pre id="{uid}-out" aria-live="polite"></pre>
<script>{_NVFP4_JS}(function () {{
  var presets = {data}, sel = document.getElementById("{uid}-preset"),
      box = document.getElementById("{uid}-values"), out = document.getElementById("{uid}-out");
  function show(exact) {{
    if (exact) {{ out.textContent = window.pt215Nvfp4Explain(exact); return; }}
    var parts = box.value.split(/[,\\n]/).map(function (s) {{ return s.trim(); }}).filter(Boolean);
    var vals = parts.map(Number), bad = parts.filter(function (s, i) {{ return !isFinite(vals[i]); }});
    if (bad.length) out.textContent = "ValueError: not a finite number: " + bad[0];
    else if (vals.length !== 16) out.textContent = "ValueError: need exactly 16 values, got " + vals.length;
    else out.textContent = window.pt215Nvfp4Explain(vals);
  }}
  // A preset shows the table of its exact values (as printed above); edited text is parsed as typed.
  sel.addEventListener("change", function () {{
    box.value = presets[sel.value].text; show(presets[sel.value].values);
  }});
  box.addEventListener("input", function () {{ show(); }});
  show(presets[sel.value].values);
}})();</script>
</div>""")
