// The book's page script (see pt215.site): the search index (160 KB) loads only when a search field is used,
// and search results quote the page's text, not its title, print-only contents or hidden setup code.
// (`Search` is searchtools.js' global, a `const`: it is not on `window`.)
(() => {
  "use strict";
  let asked = false;
  const loadIndex = () => {
    if (asked || typeof Search === "undefined" || Search.hasIndex() || document.getElementById("search-results") &&
        location.pathname.endsWith("/search.html")) return;
    asked = true;
    Search.loadIndex((document.documentElement.dataset.content_root || "") + "searchindex.js");
  };
  document.addEventListener("focusin", (e) => {
    if (e.target.matches && e.target.matches("input[name=q]")) loadIndex();
  });
  const patch = () => {
    if (typeof Search === "undefined" || !Search.htmlToText || Search.htmlToText.pt215) return;
    const original = Search.htmlToText;
    Search.htmlToText = (htmlString, anchor) => {
      const doc = new DOMParser().parseFromString(htmlString, "text/html");
      doc.querySelectorAll("#jb-print-docs-body, .bd-header-article, .pt215-badges, .prev-next-area, " +
                           ".bd-sidebar-secondary, .pt215-zoom-hint, article h1, details.hide > summary, .tag_hide-input details").forEach((el) => el.remove());
      return original(doc.documentElement.outerHTML, anchor);
    };
    Search.htmlToText.pt215 = true;
  };
  patch();
  document.addEventListener("DOMContentLoaded", patch);
})();
