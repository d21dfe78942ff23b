"""The HTML report's inline style sheet and script: the page fetches nothing, so they travel inside it."""

from __future__ import annotations

from .svg import STATUS_COLOURS

__all__ = ["PAGE_CSS", "SORT_JS"]

_C = STATUS_COLOURS

PAGE_CSS = f"""
:root {{ --healthy: {_C["healthy"]}; --suspect: {_C["suspect"]}; --quarantined: {_C["quarantined"]};
  --probation: {_C["probation"]}; --ink: #1d232a; --muted: #5f6b76; --line: #d8dee4; --band: #90a4ae; }}
* {{ box-sizing: border-box; }}
body {{ font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink);
  margin: 0 auto; padding: 16px 24px 48px; max-width: 1240px; background: #fff; }}
h1 {{ font-size: 22px; margin: 4px 0 2px; }}
h2 {{ font-size: 17px; margin: 28px 0 6px; border-bottom: 1px solid var(--line); padding-bottom: 3px; }}
.meta, .note, caption, figcaption {{ color: var(--muted); font-size: 12.5px; }}
caption {{ text-align: left; padding: 4px 0; caption-side: bottom; }}
.cards {{ display: flex; gap: 12px; flex-wrap: wrap; margin: 14px 0 6px; }}
.card {{ flex: 1 1 150px; border-radius: 6px; padding: 10px 14px; color: #fff; }}
.card b {{ display: block; font-size: 30px; line-height: 1.1; }}
.card.healthy {{ background: var(--healthy); }} .card.suspect {{ background: var(--suspect); }}
.card.quarantined {{ background: var(--quarantined); }} .card.probation {{ background: var(--probation); }}
.totals {{ margin: 6px 0; }}
table {{ border-collapse: collapse; width: 100%; font-size: 13px; }}
th, td {{ padding: 3px 8px; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top; }}
td.n, th.n {{ text-align: right; font-variant-numeric: tabular-nums; }}
thead th {{ background: #f3f5f7; position: sticky; top: 0; white-space: nowrap; }}
table.sortable thead th {{ cursor: pointer; user-select: none; }}
table.sortable thead th::after {{ content: " \\2195"; color: #aab4bd; }}
table.sortable thead th[aria-sort="ascending"]::after {{ content: " \\2191"; color: var(--ink); }}
table.sortable thead th[aria-sort="descending"]::after {{ content: " \\2193"; color: var(--ink); }}
.st {{ font-weight: 600; }}
.st.healthy {{ color: var(--healthy); }} .st.suspect {{ color: var(--suspect); }}
.st.quarantined {{ color: var(--quarantined); }} .st.probation {{ color: var(--probation); }}
td.slow {{ background: #fde9c8; color: #8a4b00; font-weight: 600; }}
tr.lemon td {{ background: #fdecea; }}
.badge {{ display: inline-block; padding: 0 6px; border-radius: 8px; background: var(--quarantined); color: #fff;
  font-size: 11px; margin-left: 4px; }}
.scroll {{ max-height: 640px; overflow: auto; border: 1px solid var(--line); }}
svg {{ display: block; max-width: 100%; height: auto; }}
svg text {{ font: 11px system-ui, sans-serif; fill: var(--muted); }}
svg .grid {{ stroke: #edf0f2; stroke-width: 1; }}
svg .axis {{ stroke: #9aa5ae; stroke-width: 1; }}
svg .band {{ fill: var(--band); fill-opacity: .55; }}
svg .dot {{ fill: var(--quarantined); }}
svg .mark {{ stroke: var(--quarantined); stroke-width: 2; }}
svg.spark, svg.bar {{ display: inline-block; vertical-align: middle; }}
td.wrap {{ max-width: 460px; overflow-wrap: anywhere; }}
code {{ font-size: 12px; }}
"""
"""Status colours come from :data:`sdcguard.fleet.report.svg.STATUS_COLOURS`, the one table of them."""

SORT_JS = """
(function () {
  "use strict";
  function key(cell, numeric) {
    var v = cell.getAttribute("data-v");
    if (v === null) { v = cell.textContent; }
    if (numeric) { var x = parseFloat(v); return isNaN(x) ? -Infinity : x; }
    return v.toLowerCase();
  }
  function sortBy(table, th, index) {
    var ascending = th.getAttribute("aria-sort") !== "ascending";
    var numeric = th.classList.contains("n") || th.getAttribute("data-sort") === "num";
    var heads = table.tHead.rows[0].cells;
    for (var i = 0; i < heads.length; i++) { heads[i].removeAttribute("aria-sort"); }
    th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = key(a.cells[index], numeric), y = key(b.cells[index], numeric);
      return (x < y ? -1 : x > y ? 1 : 0) * (ascending ? 1 : -1);
    });
    var frag = document.createDocumentFragment();
    rows.forEach(function (r) { frag.appendChild(r); });
    body.appendChild(frag);
  }
  var tables = document.querySelectorAll("table.sortable");
  Array.prototype.forEach.call(tables, function (table) {
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, index) {
      th.tabIndex = 0;
      th.title = "sort by " + th.textContent;
      th.addEventListener("click", function () { sortBy(table, th, index); });
      th.addEventListener("keydown", function (e) {
        if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sortBy(table, th, index); }
      });
    });
  });
})();
"""
"""Click (or Enter on) a header of a ``table.sortable`` to sort by it; again to reverse. A cell's ``data-v`` is
its sort key when present (raw numbers, Unix times); headers with class ``n`` or ``data-sort="num"`` sort
numerically."""
