#!/usr/bin/env bash
# Fetch the three browser libraries the website loads at view time (MathJax, require.js, the Jupyter widget
# manager) from the npm registry at pinned versions into _vendor/, so the site works offline.
# Not committed (megabytes); run by the README's setup command. Needs npm.
set -euo pipefail
cd "$(dirname "$0")/.."
MATHJAX=3.2.2
REQUIREJS=2.3.7
HTML_MANAGER=1.0.6
out=_vendor
stamp="$out/.versions"
want="mathjax@$MATHJAX requirejs@$REQUIREJS @jupyter-widgets/html-manager@$HTML_MANAGER"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "vendor_js: $out is up to date ($want)"; exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "mathjax@$MATHJAX" "requirejs@$REQUIREJS" "@jupyter-widgets/html-manager@$HTML_MANAGER" >/dev/null)
rm -rf "$out"; mkdir -p "$out/mathjax"
for t in "$tmp"/*.tgz; do mkdir -p "$tmp/x"; tar -xzf "$t" -C "$tmp/x"; mv "$tmp/x/package" "$tmp/$(basename "$t" .tgz)"; done
mj="$tmp/mathjax-$MATHJAX/es5"
# MathJax: the combined TeX/MathML->CHTML bundle plus what it loads lazily (fonts, extensions).
cp "$mj/tex-mml-chtml.js" "$out/mathjax/"
mkdir -p "$out/mathjax/output/chtml"
cp -r "$mj/output/chtml/fonts" "$out/mathjax/output/chtml/"
cp -r "$mj/input" "$mj/a11y" "$mj/ui" "$out/mathjax/" 2>/dev/null || true
cp "$tmp/requirejs-$REQUIREJS/require.js" "$out/require.js"
cp "$tmp/jupyter-widgets-html-manager-$HTML_MANAGER/dist/embed-amd.js" "$out/embed-amd.js"
echo "$want" > "$stamp"
du -sh "$out" | sed 's/^/vendor_js: /'
