#!/usr/bin/env bash
# Fetch the three browser libraries the website loads at view time (MathJax, require.js, the Jupyter widget
# manager) from the npm registry at pinned versions into _vendor/, so the site works offline. MathJax's Node
# build goes to _vendor/.mathjax-node/ (a dot folder: Sphinx does not copy it into the site): pt215.site.math_svg
# renders the book's math to SVG with it when the site is built, so pages load no MathJax at all.
# Not committed (megabytes); run by the README's setup command. Needs npm.
set -euo pipefail
cd "$(dirname "$0")/.."
MATHJAX=3.2.2
REQUIREJS=2.3.7
HTML_MANAGER=1.0.6
out=_vendor
stamp="$out/.versions"
want="mathjax@$MATHJAX requirejs@$REQUIREJS @jupyter-widgets/html-manager@$HTML_MANAGER mathjax-node-svg"
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
# MathJax for Node (build time only): TeX in, SVG out, through its lite DOM adaptor.
node_mj="$out/.mathjax-node/es5"
mkdir -p "$node_mj"
cp "$mj/node-main.js" "$mj/core.js" "$mj/startup.js" "$mj/loader.js" "$node_mj/"
cp -r "$mj/adaptors" "$mj/input" "$mj/output" "$node_mj/"
cp "$tmp/requirejs-$REQUIREJS/require.js" "$out/require.js"
cp "$tmp/jupyter-widgets-html-manager-$HTML_MANAGER/dist/embed-amd.js" "$out/embed-amd.js"
echo "$want" > "$stamp"
du -sh "$out" | sed 's/^/vendor_js: /'
