"""pt215.widgets and pt215.figures (the website's own helpers are tested in tests/test_book_ext.py)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import torch

from pt215 import nvfp4, widgets


def test_busbw_slider_is_deterministic_and_checks_arguments():
    a, b = widgets.busbw_factor_slider(4).data, widgets.busbw_factor_slider(4).data
    assert a == b and "2(n-1)/n = <b>1.500</b>" in a and 'value="4"' in a
    assert widgets.busbw_factor_slider(8).data != a  # a second widget on a page gets its own ids
    with pytest.raises(ValueError, match="lo <= value <= hi"):
        widgets.busbw_factor_slider(1)
    with pytest.raises(TypeError, match="value must be an int"):
        widgets.busbw_factor_slider(4.0)


def test_nvfp4_explorer_checks_presets():
    html = widgets.nvfp4_block_explorer({"ramp": torch.linspace(-1, 1, 16)}).data
    assert "<option value=\"ramp\" selected>" in html and "</script>" in html
    with pytest.raises(ValueError, match="16 values"):
        widgets.nvfp4_block_explorer({"short": [1.0, 2.0]})
    with pytest.raises(ValueError, match="initial must be one of"):
        widgets.nvfp4_block_explorer({"ramp": torch.linspace(-1, 1, 16)}, initial="nope")
    with pytest.raises(ValueError, match="at least one"):
        widgets.nvfp4_block_explorer({})


def _explain(block: list[float]) -> str:
    """The table chapter 5.1 prints (its `explain`), from pt215.nvfp4."""
    x = torch.as_tensor(block, dtype=torch.float32).reshape(1, 16)
    q = nvfp4.quantize(x)
    rec = q.dequantize()
    lines = [f"per_tensor_scale g = {q.per_tensor_scale.item():.6g}   block scale (e4m3) = {q.scale.float().item():g}",
             "  i        x   code  e2m1    x_hat    error"]
    for i, (xi, c, r) in enumerate(zip(x[0].tolist(), q.codes()[0].tolist(), rec[0].tolist(), strict=True)):
        e2m1 = nvfp4.e2m1_decode(torch.tensor(c, dtype=torch.uint8)).item()
        lines.append(f"{i:3d} {xi:+8.4f}   {c:4d}  {e2m1:+4.1f} {r:+8.4f} {r - xi:+8.4f}")
    rel = ((rec - x).norm() / x.norm().clamp_min(1e-30)).item()
    lines.append(f"relative error ||x_hat - x|| / ||x|| = {rel:.4f}")
    return "\n".join(lines)


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node (README: setup installs it for vendor_js.sh)")
def test_nvfp4_javascript_matches_python_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    blocks = [torch.zeros(16), torch.full((16,), -0.03125), torch.linspace(-1, 1, 16),
              torch.tensor([0.1, -0.2, 0.05, 0.3, -0.1, 0.2, 0.15, -0.05, 8.0, 0.1, -0.3, 0.25, 0.0, 0.1, -0.2, 0.3])]
    blocks += [torch.randn(16, generator=g) * 10.0 ** int(torch.randint(-4, 4, (1,), generator=g)) for _ in range(60)]
    vals = [b.float().tolist() for b in blocks]
    js = widgets._NVFP4_JS.replace("})(window);", "})(globalThis);")
    js += f"\nconsole.log(JSON.stringify({json.dumps(vals)}.map(v => globalThis.pt215Nvfp4Explain(v))));"
    out = json.loads(subprocess.run(["node", "-e", js], capture_output=True, text=True, check=True, timeout=60).stdout)
    for v, table in zip(vals, out, strict=True):
        assert table == _explain(v)


def test_figure_show_needs_real_alt_text(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pt215.figures import show

    plt.figure()
    with pytest.raises(ValueError, match="describing the figure"):
        show("plot")
    with pytest.raises(ValueError, match="not name a file"):
        show("../../_images/0123456789abcdef.png")
    plt.close("all")
